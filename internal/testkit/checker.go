package testkit

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// Report is what the outbox invariant checker found: the committed outbox
// rows of a topic against what a read_committed reader sees on it.
type Report struct {
	Committed  int // committed outbox rows for the topic
	Seen       int // envelopes read from the topic
	Lost       []string
	Duplicated []string // event ids seen more than once
	OutOfOrder []string // "source: seq a after seq b"
	Unexpected []string // event ids on the topic with no committed row (e.g. rolled back)
}

// Err summarises the violations, or is nil.
func (r Report) Err() error {
	if len(r.Lost)+len(r.Duplicated)+len(r.OutOfOrder)+len(r.Unexpected) == 0 {
		return nil
	}
	show := func(s []string) string {
		if len(s) > 5 {
			return strings.Join(s[:5], ", ") + fmt.Sprintf(" … (%d more)", len(s)-5)
		}
		return strings.Join(s, ", ")
	}
	return fmt.Errorf("outbox invariants broken (committed %d, seen %d): lost %d [%s], duplicated %d [%s], out of order %d [%s], unexpected %d [%s]",
		r.Committed, r.Seen, len(r.Lost), show(r.Lost), len(r.Duplicated), show(r.Duplicated),
		len(r.OutOfOrder), show(r.OutOfOrder), len(r.Unexpected), show(r.Unexpected))
}

func (r Report) String() string {
	return fmt.Sprintf("committed=%d seen=%d lost=%d duplicated=%d out_of_order=%d unexpected=%d",
		r.Committed, r.Seen, len(r.Lost), len(r.Duplicated), len(r.OutOfOrder), len(r.Unexpected))
}

// MissingPatience is how long Check keeps reading while committed events
// are missing from the topic and none turns up, before it reports them lost.
const MissingPatience = 15 * time.Second

// Checker reads a topic with read_committed and compares it with the outbox
// table: every committed row exactly once (R1, R3), each source in seq order
// (R2), nothing that was not committed. Reusable by any test that publishes
// through the outbox (relay tests, consumer tests).
type Checker struct {
	pool  *pgxpool.Pool
	topic string
	r     *audit.TopicReader
	seq   *audit.Sequence

	keep      func(envelope.Envelope) bool // nil: every envelope
	committed string                       // query for the committed event ids ($1 = topic)
	args      []any

	report Report
}

// NewChecker starts reading topic from its beginning. opts are added to
// the clients (e.g. kgo.SeedBrokers of a private broker).
func NewChecker(t testing.TB, pool *pgxpool.Pool, topic string, opts ...kgo.Opt) *Checker {
	t.Helper()
	c := &Checker{
		pool: pool, topic: topic, seq: audit.NewSequence(),
		committed: `SELECT event_id FROM onceflow.outbox WHERE topic = $1`,
	}
	r, err := audit.NewTopicReader(topic, c.add,
		append([]kgo.Opt{kgo.SeedBrokers(strings.Split(KafkaBrokers(t), ",")...)}, opts...)...)
	if err != nil {
		t.Fatalf("checker: %v", err)
	}
	t.Cleanup(r.Close)
	c.r = r
	return c
}

// add takes one record the reader read: the envelopes Only keeps are
// counted and their order judged.
func (c *Checker) add(rec audit.Record) {
	if rec.Err == nil && c.keep != nil && !c.keep(rec.Env) {
		return
	}
	c.report.Seen++
	if rec.Err != nil {
		c.report.Unexpected = append(c.report.Unexpected, rec.Err.Error())
		return
	}
	c.seq.Add(rec.Env.EventID, rec.Env.Source, rec.Env.Seq)
}

// Only makes the checker look only at the envelopes keep accepts (e.g. the
// events of one database when relays of several publish to the topic); the
// others are not counted at all. Call it before Check.
func (c *Checker) Only(keep func(envelope.Envelope) bool) *Checker {
	c.keep = keep
	return c
}

// Decoding makes the checker read each record through view before it
// reads the record's envelope, e.g. a registered wire format's record
// through a wire.Decoder into its JSON view. A record view refuses is
// reported unexpected, with view's error. Call it before Check.
func (c *Checker) Decoding(view func(context.Context, *kgo.Record) (*kgo.Record, error)) *Checker {
	c.r.View = view
	return c
}

// CommittedFrom replaces the committed set (by default the event ids of the
// topic's outbox rows) with the event ids query returns, e.g. from a table
// the producers write in the same transaction as the event: with
// -delete-on-publish the outbox keeps no row of a published event. The
// query gets no topic argument unless args supply it. Call it before Check.
func (c *Checker) CommittedFrom(query string, args ...any) *Checker {
	c.committed, c.args = query, args
	return c
}

// WaitDrained waits until the topic has no unpublished outbox rows.
func WaitDrained(ctx context.Context, pool *pgxpool.Pool, topic string) error {
	for {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox WHERE topic = $1 AND id IN (SELECT id FROM onceflow.outbox_pending)`, topic).Scan(&n)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("outbox not drained (%d unpublished rows, last error %v): %w", n, err, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Check waits until the outbox is drained for the topic, reads the topic up
// to its last stable offset, and reports. It can be called more than once;
// reading continues where it stopped.
func (c *Checker) Check(ctx context.Context) (Report, error) {
	if err := WaitDrained(ctx, c.pool, c.topic); err != nil {
		return c.report, err
	}
	committed := map[string]bool{}
	args := c.args
	if c.args == nil && strings.Contains(c.committed, "$1") {
		args = []any{c.topic}
	}
	rows, err := c.pool.Query(ctx, c.committed, args...)
	if err != nil {
		return c.report, err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return c.report, err
		}
		committed[id] = true
	}
	if err := rows.Err(); err != nil {
		return c.report, err
	}
	// Commit markers are written just after EndTransaction returns, so the
	// last stable offset may trail the outbox marks for a moment: read to
	// it, and read again while committed rows are still missing. Events
	// still missing after MissingPatience without one of them turning up
	// are reported lost.
	lastMissing, since := -1, time.Now()
	for {
		if err := c.r.ReadToStable(ctx); err != nil {
			return c.report, err
		}
		missing := 0
		for id := range committed {
			if c.seq.Count[id] == 0 {
				missing++
			}
		}
		if missing != lastMissing {
			lastMissing, since = missing, time.Now()
		}
		if missing == 0 || ctx.Err() != nil || time.Since(since) > MissingPatience {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	r := c.report
	r.Committed = len(committed)
	var phantom []string
	r.Lost, r.Duplicated, phantom = c.seq.Diff(committed)
	r.OutOfOrder = append([]string(nil), c.seq.OutOfOrder...)
	r.Unexpected = append(append([]string(nil), c.report.Unexpected...), phantom...)
	sort.Strings(r.Unexpected)
	return r, nil
}

// Count is how many times event id was read so far.
func (c *Checker) Count(eventID string) int { return c.seq.Count[eventID] }
