package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// Screening: what part of a batch to publish now, and which row to set
// aside without asking Kafka. It decides; the publisher carries the
// decision out.

// verdict is what screening decided about a batch.
type verdict struct {
	rows []row // to publish now (none: the round is over)
	// setAside, when set, is the reason to set row aside for, err the
	// cause; otherwise a non-nil err is a topic check that failed to run
	// (the batch waits, and the check is retried).
	setAside string
	row      row
	err      error
}

// screen returns the part of rows to publish now. A row that Kafka refused
// (or will: an illegal topic name) goes alone; refused alone, it is set
// aside and only its source waits. Topics are checked against
// Config.TopicCheck before their first publish. ctx ends the checks (the
// verdict is then empty).
func screen(ctx context.Context, cfg Config, topics *topicChecker, rows []row, suspects map[int64]refused) verdict {
	rows = isolate(rows, suspects)
	if len(rows) == 1 && rows[0].oversized {
		return verdict{setAside: ReasonTooLarge, row: rows[0], err: fmt.Errorf(
			"row is %d bytes (payload, key, headers and names), over the relay's batch-max-bytes of %d: not read; "+
				"raise -batch-max-bytes (and the topic's max.message.bytes) and retry it, or skip it",
			rows[0].size, cfg.BatchMaxBytes)}
	}
	if k, err := reservedRow(rows, cfg.CheckpointTopic); err != nil {
		if k > 0 {
			return verdict{rows: rows[:k]} // publish what is before the reserved topic
		}
		return verdict{setAside: ReasonInvalidTopic, row: rows[0], err: err}
	}
	if len(rows) == 1 {
		if err := outbox.CheckTopic(rows[0].topic); err != nil {
			return verdict{setAside: ReasonInvalidTopic, row: rows[0], err: err}
		}
	}
	if k, err := topics.check(ctx, rows); err != nil {
		switch {
		case ctx.Err() != nil:
			return verdict{}
		case k > 0:
			return verdict{rows: rows[:k]} // publish what is before the refused topic
		case errors.Is(err, ErrTopicRefused):
			return verdict{setAside: ReasonTopicContract, row: rows[0], err: err}
		default:
			return verdict{err: err}
		}
	}
	return verdict{rows: rows}
}

// topicChecker runs Config.TopicCheck. What it accepted it remembers for
// the relay's lifetime; only the publisher of the current term calls it.
type topicChecker struct {
	fn      func(ctx context.Context, topic string) error // Config.TopicCheck
	checked map[string]bool
}

// check runs the check once per topic, before the first publish to it, and
// returns the index of the first row whose topic fails with the error. A
// topic that fails stays unchecked and is checked again next time.
func (c *topicChecker) check(ctx context.Context, rows []row) (int, error) {
	if c.fn == nil {
		return 0, nil
	}
	if c.checked == nil {
		c.checked = map[string]bool{}
	}
	for i, w := range rows {
		if c.checked[w.topic] {
			continue
		}
		if err := c.fn(ctx, w.topic); err != nil {
			return i, &TopicError{Topic: w.topic, Err: err}
		}
		c.checked[w.topic] = true
	}
	return 0, nil
}

// reservedRow is the relay's own line behind the database's: the index of
// the first row whose topic is the relay's checkpoint topic, with an error
// naming it; -1 and nil when there is none.
func reservedRow(rows []row, checkpointTopic string) (int, error) {
	for i, w := range rows {
		if w.topic == checkpointTopic {
			return i, &TopicError{Topic: w.topic, Err: ErrTopicReserved}
		}
	}
	return -1, nil
}

// isolate shortens a batch so that a suspect row (refused in an earlier
// transaction, being retried after it was set aside, over the byte budget,
// or with a topic name Kafka would refuse) is published, or set aside,
// alone: the batch stops before the first suspect, and a batch that starts
// with one holds only it. Every row before it is older, so order is kept.
func isolate(rows []row, suspects map[int64]refused) []row {
	for i, w := range rows {
		_, suspect := suspects[w.id]
		if suspect || w.retrying || w.oversized || outbox.CheckTopic(w.topic) != nil {
			if i == 0 {
				return rows[:1]
			}
			return rows[:i]
		}
	}
	return rows
}

func isTopicReason(reason string) bool {
	switch reason {
	case ReasonInvalidTopic, ReasonTopicAuthorization, ReasonTopicMissing, ReasonTopicContract:
		return true
	}
	return false
}
