// Package inboxtest runs a handler of your own through the real inbox and
// sequence guard (package inbox) against a real PostgreSQL, without Kafka,
// from your _test.go files.
//
// New creates a database of its own on the server you name, migrated to
// onceflow's schema, runs your Setup (your tables) and drops the database
// when the test ends. Events are made with Harness.Event and applied with
// Harness.Apply exactly as a consumer's partition worker applies a fetched
// batch: the inbox rows, the guard, your handler and the partition's next
// offset in one transaction; a failing handler is retried and then
// dead-lettered. AssertApplied and AssertDeadLettered check the outcome.
//
// Harness.CheckRedelivery runs, in one call, the three redelivery tests
// every consumer should pass, counting your effects with a function you
// give:
//
//   - the same event delivered twice has one effect;
//   - a crash between your handler's writes and the commit (the connection
//     is cut, as a killed process's is) leaves no effect, and the
//     redelivery then applies the event once — this fails a handler that
//     writes outside the transaction it is given;
//   - two consumers racing the same event: one applies it, the other waits
//     only for the first one's transaction and then returns it as a
//     duplicate without running the handler.
package inboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/migrate/migratetest"
)

// Topic is the topic name the harness's records carry.
const Topic = "inboxtest"

// Config configures a Harness.
type Config struct {
	// DSN is the URL of a PostgreSQL role that may create databases
	// (required). Each Harness creates a database there with
	// migratetest.NewDatabase (a copy of a template database
	// "onceflow_tpl_<hash>" holding the migrated schema, kept for the next
	// run) and drops it when the test ends.
	DSN string

	// Handler is the handler under test (required), e.g. an
	// *inbox.Router.
	Handler inbox.Handler

	// Inbox is the base of the inbox configuration: Ordering,
	// ConsumerName, the guard's and retry settings apply as in a consumer.
	// Pool and Handler are the harness's. Defaults: Group "inboxtest",
	// RetryMaxAttempts 3, retry intervals of 1 to 10 ms (a dead letter takes
	// milliseconds), a Logger writing to the test log; the rest as in
	// inbox.Config.WithDefaults.
	Inbox inbox.Config

	// Setup creates what the handler needs (its tables) in the fresh
	// database before any event (default: nothing).
	Setup func(ctx context.Context, pool *pgxpool.Pool) error
}

// Harness applies events to a handler through the inbox, in a database of
// its own. Its methods may be called from several goroutines.
type Harness struct {
	// Pool and URL are the harness's database.
	Pool *pgxpool.Pool
	URL  string

	t       testing.TB
	cfg     inbox.Config
	applier *inbox.Applier

	mu      sync.Mutex
	seqs    map[string]int64
	offsets map[string]int64
}

// New creates the harness's database, runs cfg.Setup and returns the
// harness. It fails t on any error.
func New(t testing.TB, cfg Config) *Harness {
	t.Helper()
	if cfg.DSN == "" {
		t.Fatalf("inboxtest: Config.DSN is required (a PostgreSQL URL of a role that may create databases)")
	}
	if cfg.Handler == nil {
		t.Fatalf("inboxtest: Config.Handler is required")
	}
	db := migratetest.NewDatabase(t, cfg.DSN)
	if cfg.Setup != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := cfg.Setup(ctx, db.Pool); err != nil {
			t.Fatalf("inboxtest: Setup: %v", err)
		}
	}
	ic := cfg.Inbox
	ic.Pool, ic.Handler, ic.BatchHandler = db.Pool, cfg.Handler, nil
	if ic.Group == "" {
		ic.Group = "inboxtest"
	}
	if ic.RetryMaxAttempts == 0 {
		ic.RetryMaxAttempts = 3
	}
	if ic.RetryInitialInterval == 0 {
		ic.RetryInitialInterval = time.Millisecond
	}
	if ic.RetryMaxInterval == 0 {
		ic.RetryMaxInterval = 10 * time.Millisecond
	}
	if ic.Logger == nil {
		ic.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	h := &Harness{Pool: db.Pool, URL: db.URL, t: t, cfg: ic, seqs: map[string]int64{}, offsets: map[string]int64{}}
	h.applier = h.newApplier(cfg.Handler)
	return h
}

// newApplier is an inbox Applier of the harness's configuration with
// another handler (the redelivery checks wrap the one under test).
func (h *Harness) newApplier(hd inbox.Handler) *inbox.Applier {
	h.t.Helper()
	c := h.cfg
	c.Handler = hd
	a, err := inbox.NewApplier(c)
	if err != nil {
		h.t.Fatalf("inboxtest: %v", err)
	}
	return a
}

// Event returns the next event of source (seq 1, 2, … per source, as the
// outbox allocates them) of eventType with v encoded as JSON as its payload
// (a []byte or json.RawMessage is taken as is). Its EventID is
// "<source>:<seq>". Apply a source's events in the order they were made:
// as in production, an event whose predecessors were never applied is
// parked behind the gap (ApplyResult.Parked).
func (h *Harness) Event(source, eventType string, v any) envelope.Envelope {
	h.t.Helper()
	var payload []byte
	switch p := v.(type) {
	case []byte:
		payload = p
	case json.RawMessage:
		payload = p
	default:
		b, err := envelope.JSONCodec{}.Marshal(v)
		if err != nil {
			h.t.Fatalf("inboxtest: encode %T: %v", v, err)
		}
		payload = b
	}
	h.mu.Lock()
	h.seqs[source]++
	seq := h.seqs[source]
	h.mu.Unlock()
	return envelope.Envelope{
		EventID:     source + ":" + strconv.FormatInt(seq, 10),
		Source:      source,
		Seq:         seq,
		EventType:   eventType,
		ContentType: envelope.ContentTypeJSON,
		Payload:     payload,
	}
}

// record is ev as the consumer reads it from partition 0 of Topic. An event
// keeps its offset: applying it again is a redelivery of the same record.
func (h *Harness) record(ev envelope.Envelope) *kgo.Record {
	h.mu.Lock()
	off, ok := h.offsets[ev.EventID]
	if !ok {
		off = int64(len(h.offsets))
		h.offsets[ev.EventID] = off
	}
	h.mu.Unlock()
	r := ev.Record(Topic)
	r.Partition, r.Offset = 0, off
	return r
}

// Apply applies evs as one fetched batch, in order, and returns what
// happened. It fails the test on an infrastructure error (the database).
func (h *Harness) Apply(evs ...envelope.Envelope) inbox.ApplyResult {
	h.t.Helper()
	res, err := h.apply(context.Background(), h.applier, evs...)
	if err != nil {
		h.t.Fatalf("inboxtest: apply %s: %v", ids(evs), err)
	}
	return res
}

func (h *Harness) apply(ctx context.Context, a *inbox.Applier, evs ...envelope.Envelope) (inbox.ApplyResult, error) {
	recs := make([]*kgo.Record, len(evs))
	for i, ev := range evs {
		recs[i] = h.record(ev)
	}
	return a.Apply(ctx, recs...)
}

// AssertApplied fails the test unless the inbox recorded ev as applied.
func (h *Harness) AssertApplied(ev envelope.Envelope) {
	h.t.Helper()
	if st, reason := h.status(ev); st != "processed" {
		h.t.Errorf("inboxtest: event %s (%s): inbox status %s, want applied (processed)%s", ev.EventID, ev.EventType, st, reason)
	}
}

// AssertDeadLettered fails the test unless the inbox recorded ev as dead
// with a reason containing reason.
func (h *Harness) AssertDeadLettered(ev envelope.Envelope, reason string) {
	h.t.Helper()
	st, got := h.status(ev)
	if st != "dead" {
		h.t.Errorf("inboxtest: event %s (%s): inbox status %s, want dead-lettered%s", ev.EventID, ev.EventType, st, got)
		return
	}
	if !strings.Contains(got, reason) {
		h.t.Errorf("inboxtest: event %s (%s): dead-lettered with reason %q, want one containing %q", ev.EventID, ev.EventType, strings.TrimPrefix(got, ": "), reason)
	}
}

// status is ev's inbox status ("none" without a row) and ": <last error>"
// when it has one.
func (h *Harness) status(ev envelope.Envelope) (string, string) {
	h.t.Helper()
	var st, last string
	err := h.Pool.QueryRow(context.Background(), `
		SELECT status::text, coalesce(last_error, '') FROM onceflow.inbox WHERE consumer = $1 AND event_id = $2`,
		h.consumer(), ev.EventID).Scan(&st, &last)
	if errors.Is(err, pgx.ErrNoRows) {
		return "none", ""
	}
	if err != nil {
		h.t.Fatalf("inboxtest: read the inbox row of %s: %v", ev.EventID, err)
	}
	if last != "" {
		last = ": " + last
	}
	return st, last
}

func (h *Harness) consumer() string {
	if h.cfg.ConsumerName == "" {
		return inbox.DefaultConsumerName
	}
	return h.cfg.ConsumerName
}

func ids(evs []envelope.Envelope) string {
	s := make([]string, len(evs))
	for i, ev := range evs {
		s[i] = ev.EventID
	}
	return strings.Join(s, ", ")
}

// testWriter writes log lines to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// errf is fmt.Errorf prefixed for the test log.
func errf(format string, a ...any) error { return fmt.Errorf("inboxtest: "+format, a...) }
