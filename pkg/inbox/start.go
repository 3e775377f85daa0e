package inbox

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// StartPosition is where the consumer starts reading a partition for which
// neither PostgreSQL (onceflow.consumer_offsets) nor the consumer group has
// an offset: a new consumer group, a new topic, a recreated topic. Its zero
// value is StartEarliest.
type StartPosition struct {
	latest bool
	at     time.Time
}

var (
	// StartEarliest reads the whole retained log (the default): every
	// event still on the topic is applied.
	StartEarliest = StartPosition{}
	// StartLatest reads only what is published after the consumer joins:
	// the retained backlog is skipped.
	StartLatest = StartPosition{latest: true}
)

// StartAt starts at the first record whose timestamp is at or after t.
func StartAt(t time.Time) StartPosition { return StartPosition{at: t} }

// IsEarliest reports whether p reads the whole retained log.
func (p StartPosition) IsEarliest() bool { return !p.latest && p.at.IsZero() }

// String is "earliest", "latest" or the time in RFC 3339.
func (p StartPosition) String() string {
	switch {
	case p.latest:
		return "latest"
	case p.at.IsZero():
		return "earliest"
	}
	return p.at.UTC().Format(time.RFC3339)
}

// ParseStartPosition parses "earliest", "latest" or an RFC 3339 time.
func ParseStartPosition(s string) (StartPosition, error) {
	switch s {
	case "", "earliest":
		return StartEarliest, nil
	case "latest":
		return StartLatest, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return StartPosition{}, fmt.Errorf("start position %q: want earliest, latest or an RFC 3339 time (2026-12-01T00:00:00Z)", s)
	}
	return StartAt(t), nil
}

func (p StartPosition) offset() kgo.Offset {
	switch {
	case p.latest:
		return kgo.NewOffset().AtEnd()
	case p.at.IsZero():
		return kgo.NewOffset().AtStart()
	}
	return kgo.NewOffset().AfterMilli(p.at.UnixMilli())
}
