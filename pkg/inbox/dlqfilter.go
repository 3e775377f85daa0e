package inbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pkg/dbtx"
	"github.com/onceflow/onceflow/pkg/inbox/status"

	"github.com/jackc/pgx/v5"
)

// DeadLetterFilter selects dead and held inbox rows of one consumer. Empty
// fields select everything; the zero value selects every dead and held row.
// The same filter drives `consumer dlq list/replay` and the admin API.
type DeadLetterFilter struct {
	// Statuses to include: "dead", "held" (default both).
	Statuses []status.Status
	// EventType matches the event type; '*' matches any run of characters
	// ("billing.*").
	EventType string
	// Source matches the source exactly.
	Source string
	// ErrorContains matches rows whose last error contains it, ignoring
	// case.
	ErrorContains string
	// ReceivedFrom and ReceivedTo bound received_at: From <= received_at <
	// To. Zero is unbounded.
	ReceivedFrom, ReceivedTo time.Time
	// Group is the ID of an error group (DeadLetterGroup.ID).
	Group string
	// EventIDs restricts the rows to these events.
	EventIDs []string
}

// Empty reports whether f selects every dead and held row.
func (f DeadLetterFilter) Empty() bool {
	return len(f.Statuses) == 0 && f.EventType == "" && f.Source == "" && f.ErrorContains == "" &&
		f.ReceivedFrom.IsZero() && f.ReceivedTo.IsZero() && f.Group == "" && len(f.EventIDs) == 0
}

// Validate names the first bad field.
func (f DeadLetterFilter) Validate() error {
	for _, s := range f.Statuses {
		if s != status.Dead && s != status.Held {
			return fmt.Errorf("status %q: want dead or held", s)
		}
	}
	if !f.ReceivedFrom.IsZero() && !f.ReceivedTo.IsZero() && !f.ReceivedFrom.Before(f.ReceivedTo) {
		return fmt.Errorf("time range: from %s is not before to %s", f.ReceivedFrom.Format(time.RFC3339), f.ReceivedTo.Format(time.RFC3339))
	}
	if f.Group != "" && !isGroupID(f.Group) {
		return fmt.Errorf("error group %q: want the 12 hex characters of a group id (dlq list -group-by error)", f.Group)
	}
	return nil
}

func isGroupID(s string) bool {
	if len(s) != 12 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// args are the filter's query arguments $1–$9 (qDeadWhere).
func (f DeadLetterFilter) args(consumer string) []any {
	if consumer == "" {
		consumer = DefaultConsumerName
	}
	want := f.Statuses
	if len(want) == 0 {
		want = status.NeedsOperator
	}
	statuses := make([]string, len(want))
	for i, s := range want {
		statuses[i] = string(s)
	}
	str := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	tm := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t
	}
	var ids any
	if len(f.EventIDs) > 0 {
		ids = slices.Clone(f.EventIDs)
	}
	var eventType any
	if f.EventType != "" {
		eventType = likePattern(f.EventType)
	}
	return []any{consumer, statuses, eventType, str(f.Source), str(f.ErrorContains),
		tm(f.ReceivedFrom), tm(f.ReceivedTo), str(f.Group), ids}
}

// likePattern turns a glob with '*' into a LIKE pattern, escaping LIKE's own
// wildcards.
func likePattern(glob string) string {
	var b strings.Builder
	for _, r := range glob {
		switch r {
		case '\\', '%', '_':
			b.WriteByte('\\')
			b.WriteRune(r)
		case '*':
			b.WriteByte('%')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// FindDeadLetters returns up to limit dead and held rows of consumer that
// match f, oldest first. Each row carries its error key and group id.
func FindDeadLetters(ctx context.Context, pool dbtx.DB, consumer string, f DeadLetterFilter, limit int) ([]DeadLetter, error) {
	return findDead(ctx, pool, qFindDead, consumer, f, limit)
}

// DeadLettersInReplayOrder returns up to limit rows matching f in the order
// a bulk replay applies them: grouped by source, each source's by seq.
func DeadLettersInReplayOrder(ctx context.Context, pool dbtx.DB, consumer string, f DeadLetterFilter, limit int) ([]DeadLetter, error) {
	return findDead(ctx, pool, qFindDeadReplayOrder, consumer, f, limit)
}

func findDead(ctx context.Context, pool dbtx.DB, query, consumer string, f DeadLetterFilter, limit int) ([]DeadLetter, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, query, append(f.args(consumer), limit)...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.EventID, &d.Status, &d.Source, &d.Seq, &d.EventType, &d.Topic, &d.Partition,
			&d.Offset, &d.Attempts, &d.LastError, &d.Received, &d.ErrorKey, &d.Group, &d.TraceID)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// CountDeadLetters counts the rows matching f and their distinct sources.
func CountDeadLetters(ctx context.Context, pool dbtx.DB, consumer string, f DeadLetterFilter) (events, sources int, err error) {
	if err := f.Validate(); err != nil {
		return 0, 0, err
	}
	if err := pool.QueryRow(ctx, qCountDead, f.args(consumer)...).Scan(&events, &sources); err != nil {
		return 0, 0, fmt.Errorf("count dead letters: %w", err)
	}
	return events, sources, nil
}

// DeadLetterGroup is the dead (or held) rows that share an error key: after
// one bad deploy, one group.
type DeadLetterGroup struct {
	// ID names the group in filters (12 hex characters of a hash of status
	// and key); stable for as long as the key is.
	ID     string
	Status status.Status
	// Key is the normalised error (see the package's queries: words with a
	// digit become '#').
	Key string
	// Sample is the full last error of the group's newest row.
	Sample string
	Count  int
	// EventTypes are up to 10 of the group's event types.
	EventTypes []string
	Sources    int
	First      time.Time
	Last       time.Time
}

// GroupDeadLetters groups the rows matching f by status and error key,
// biggest group first, at most limit groups.
func GroupDeadLetters(ctx context.Context, pool dbtx.DB, consumer string, f DeadLetterFilter, limit int) ([]DeadLetterGroup, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, qGroupDead, append(f.args(consumer), limit)...)
	if err != nil {
		return nil, fmt.Errorf("group dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterGroup, error) {
		var g DeadLetterGroup
		err := r.Scan(&g.ID, &g.Status, &g.Key, &g.Sample, &g.Count, &g.EventTypes, &g.Sources, &g.First, &g.Last)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("group dead letters: %w", err)
	}
	return out, nil
}
