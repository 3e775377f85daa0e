package inbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/wire"
)

// scriptedGuard answers from a table keyed by event id: the event ids to
// apply now, in order ("-late" suffix: apply marked late). A missing entry
// applies the event itself.
type scriptedGuard struct {
	script map[string][]string
	known  map[string]Event
	locked [][]string
}

func (g *scriptedGuard) lock(_ context.Context, _ pgx.Tx, evs []*item, _ []string) (admitter, error) {
	var ids []string
	for _, it := range evs {
		ids = append(ids, it.ev.EventID)
		if it.ev.EventID == "boom" {
			return nil, errors.New("guard store down")
		}
	}
	g.locked = append(g.locked, ids)
	return g, nil
}

func (g *scriptedGuard) flush(context.Context) error { return nil }

func (g *scriptedGuard) admit(_ context.Context, it *item) (admitted, error) {
	g.known[it.ev.EventID] = it.ev
	ids, ok := g.script[it.ev.EventID]
	if !ok {
		ids = []string{it.ev.EventID}
	}
	var out admitted
	for _, id := range ids {
		id, late := strings.CutSuffix(id, "-late")
		ev := g.known[id]
		ev.Late = late
		out.apply = append(out.apply, ev)
	}
	return out, nil
}

type recorder struct{ got []Event }

func (r *recorder) HandleBatch(_ context.Context, _ pgx.Tx, evs []Event) error {
	r.got = append(r.got, evs...)
	return nil
}

type applySetup struct {
	db  *testkit.DB
	app *applier
	rec *recorder
}

func setupApply(t *testing.T, g guard) applySetup {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	db := testkit.NewDB(t)
	r := &recorder{}
	cfg := Config{Pool: db.Pool, Group: "g", ConsumerName: "c1"}.WithDefaults()
	if g == nil {
		g = newGuard(&cfg)
	}
	return applySetup{db: db, app: &applier{cfg: &cfg, handler: r, guard: g}, rec: r}
}

func rec(id string, seq, offset int64) *kgo.Record {
	ev := envelope.Envelope{EventID: id, Source: "s", Seq: seq, EventType: "t", Payload: []byte(`{}`)}
	r := ev.Record("topic")
	r.Offset = offset
	return r
}

func items(recs ...*kgo.Record) []item {
	out := make([]item, len(recs))
	for i, r := range recs {
		out[i] = decodeItem(context.Background(), &wire.Decoder{}, r, 0, "")
	}
	return out
}

// TestApplyGuardSeam drives the sequence-guard seam with a scripted guard:
// the guard is locked once per transaction with the new events only, and
// the handler runs for exactly the events the guard lists, in the guard's
// order (a released event may come before the current one), with Late as
// given. A guard error aborts the whole batch as infrastructure trouble.
func TestApplyGuardSeam(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := &scriptedGuard{known: map[string]Event{}, script: map[string][]string{
		"e3": {},                      // parked
		"e1": {"e1-late"},             // late
		"e2": {"e3", "e2"},            // releases e3, due before e2
		"e4": {"e4", "e3-late", "e4"}, // odd but obeyed: the order is the guard's
	}}
	s := setupApply(t, g)
	out, err := s.app.applyTx(ctx, items(rec("e3", 3, 0), rec("e1", 1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 1 || len(s.rec.got) != 1 || s.rec.got[0].EventID != "e1" || !s.rec.got[0].Late {
		t.Fatalf("after the first batch: processed %d, handler saw %+v", out.processed, s.rec.got)
	}
	out, err = s.app.applyTx(ctx, items(rec("e3", 3, 2), rec("e2", 2, 3), rec("e4", 4, 4)))
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 5 || out.duplicates != 1 {
		t.Fatalf("second batch: %+v", out)
	}
	var order []string
	for _, ev := range s.rec.got {
		id := ev.EventID
		if ev.Late {
			id += "-late"
		}
		order = append(order, id)
	}
	if got := fmt.Sprint(order); got != "[e1-late e3 e2 e4 e3-late e4]" {
		t.Fatalf("handler order %v", got)
	}
	if got := fmt.Sprint(g.locked); got != "[[e3 e1] [e2 e4]]" {
		t.Fatalf("locked %v, want one lock per transaction with the new events", got)
	}
	// A guard error aborts the whole batch as infrastructure trouble.
	_, err = s.app.applyTx(ctx, items(rec("e5", 5, 5), rec("boom", 6, 6)))
	var he *HandlerError
	if err == nil || errors.As(err, &he) {
		t.Fatalf("guard error gave %v, want a non-handler error", err)
	}
	if n := countRows(t, s.db, `SELECT count(*) FROM onceflow.inbox WHERE event_id = 'e5'`); n != 0 {
		t.Fatalf("e5 rows %d: the batch was not rolled back", n)
	}
	var next int64
	if err := s.db.Pool.QueryRow(ctx, `SELECT next_offset FROM onceflow.consumer_offsets WHERE group_id = 'g'`).Scan(&next); err != nil || next != 5 {
		t.Fatalf("next offset %d err %v, want 5", next, err)
	}
}

// TestApplySeqGuard: the default guard (pkg/seqguard) parks an event ahead
// of a gap with its headers and payload, and releases it, rebuilt from the
// row, right after the event that fills the gap; the counts come back for
// the metrics. The engine writes nothing of its own for the guard.
func TestApplySeqGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	if _, ok := s.app.guard.(*seqGuard); !ok {
		t.Fatalf("default guard %T, want the sequence guard", s.app.guard)
	}
	out, err := s.app.applyTx(ctx, items(rec("e1", 1, 0), rec("e3", 3, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 1 || out.guard.counts.Parked != 1 || out.guard.counts.GapsOpened != 1 {
		t.Fatalf("first batch: %+v", out)
	}
	if got := inboxRows(t, s.db); got != "map[e1:processed false false e3:parked false true]" {
		t.Fatalf("rows %s", got)
	}
	out, err = s.app.applyTx(ctx, items(rec("e2", 2, 2)))
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 2 || out.guard.counts.Applied != 2 || len(out.guard.givenUp) != 0 {
		t.Fatalf("second batch: %+v", out)
	}
	var order []string
	for _, ev := range s.rec.got {
		order = append(order, fmt.Sprintf("%s@%d", ev.EventID, ev.Offset))
		if string(ev.Payload) != "{}" || ev.Source != "s" || string(ev.Key) != "s" {
			t.Fatalf("event %+v", ev)
		}
	}
	if got := fmt.Sprint(order); got != "[e1@0 e2@2 e3@1]" {
		t.Fatalf("handler order %v", got)
	}
	if got := inboxRows(t, s.db); got != "map[e1:processed false false e2:processed false false e3:processed false false]" {
		t.Fatalf("rows %s", got)
	}
}

func inboxRows(t *testing.T, db *testkit.DB) string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT event_id, status, late, payload IS NOT NULL FROM onceflow.inbox WHERE consumer = 'c1'`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id, status string
		var late, kept bool
		if err := rows.Scan(&id, &status, &late, &kept); err != nil {
			t.Fatal(err)
		}
		got[id] = fmt.Sprintf("%s %v %v", status, late, kept)
	}
	return fmt.Sprint(got)
}

func countRows(t *testing.T, db *testkit.DB, q string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestApplyIsolatedDeadLetters: a failing event is tried RetryMaxAttempts
// times and dead-lettered; its neighbours are applied (arrival order: with
// the sequence guard, the dead letter's seq would be a gap for the next).
func TestApplyIsolatedDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, arrivalOrder{})
	s.app.cfg.RetryMaxAttempts = 3
	s.app.cfg.RetryInitialInterval, s.app.cfg.RetryMaxInterval = 1, 1
	tries := 0
	s.app.handler = asBatch(HandlerFunc(func(_ context.Context, _ pgx.Tx, ev Event) error {
		if ev.EventID == "bad" {
			tries++
			return errors.New("nope")
		}
		return nil
	}))
	errs := 0
	out, err := s.app.applyIsolated(ctx, items(rec("a", 1, 0), rec("bad", 2, 1), rec("c", 3, 2)), nil, func(error) { errs++ })
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 2 || out.dead != 1 || tries != 3 || errs != 3 {
		t.Fatalf("out %+v, tries %d, errors %d", out, tries, errs)
	}
	var status, lastErr string
	var attempts int
	if err := s.db.Pool.QueryRow(ctx, `SELECT status, attempts, last_error FROM onceflow.inbox WHERE event_id = 'bad'`).Scan(&status, &attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if status != "dead" || attempts != 3 || lastErr != "nope" {
		t.Fatalf("dead letter: %s %d %q", status, attempts, lastErr)
	}
	// Replay with a fixed handler applies it once.
	res, err := Replay(ctx, s.db.Pool, "c1", s.rec, "bad")
	if err != nil || res != Replayed {
		t.Fatalf("replay: %v %v", res, err)
	}
	if res, err := Replay(ctx, s.db.Pool, "c1", s.rec, "bad"); err != nil || res != AlreadyProcessed {
		t.Fatalf("second replay: %v %v", res, err)
	}
	if len(s.rec.got) != 1 || s.rec.got[0].EventID != "bad" || s.rec.got[0].Seq != 2 {
		t.Fatalf("replayed %+v", s.rec.got)
	}
	if _, err := Replay(ctx, s.db.Pool, "c1", s.rec, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("replay of an unknown id: %v", err)
	}
}

// TestReplayThroughGuard: with the sequence guard, a dead-lettered event
// leaves a gap: its successor is parked. Replayed before the gap is given
// up, it is applied and releases the successor in order; replayed after
// the give-up, it is delivered marked late.
func TestReplayThroughGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	s.app.cfg.RetryMaxAttempts = 2
	s.app.cfg.RetryInitialInterval, s.app.cfg.RetryMaxInterval = 1, 1
	s.app.handler = asBatch(HandlerFunc(func(_ context.Context, _ pgx.Tx, ev Event) error {
		if strings.HasPrefix(ev.EventID, "bad") {
			return errors.New("nope")
		}
		return nil
	}))
	srcRec := func(src, id string, seq, offset int64) *kgo.Record {
		ev := envelope.Envelope{EventID: id, Source: src, Seq: seq, EventType: "t", Payload: []byte(`{}`)}
		r := ev.Record("topic")
		r.Offset = offset
		return r
	}
	out, err := s.app.applyIsolated(ctx, items(srcRec("a", "a1", 1, 0), srcRec("a", "bad-a2", 2, 1), srcRec("a", "a3", 3, 2),
		srcRec("b", "b1", 1, 3), srcRec("b", "bad-b2", 2, 4), srcRec("b", "b3", 3, 5)), nil, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 2 || out.dead != 2 || out.guard.counts.Parked != 2 {
		t.Fatalf("isolated: %+v", out)
	}
	s.rec.got = nil
	if res, err := Replay(ctx, s.db.Pool, "c1", s.rec, "bad-a2"); err != nil || res != Replayed {
		t.Fatalf("replay a2: %v %v", res, err)
	}
	// Source b's gap is given up (its deadline is past for this clock):
	// b3 is applied without b2.
	gone, err := s.app.giveUpExpired(ctx, s.app.guard.(*seqGuard), time.Now().Add(time.Hour), nil)
	if err != nil || gone.processed != 1 || len(gone.guard.givenUp) != 1 || gone.guard.givenUp[0].stream.Source != "b" {
		t.Fatalf("give up b: %+v %v", gone, err)
	}
	if res, err := Replay(ctx, s.db.Pool, "c1", s.rec, "bad-b2"); err != nil || res != ReplayedLate {
		t.Fatalf("replay b2: %v %v", res, err)
	}
	var got []string
	for _, ev := range s.rec.got {
		got = append(got, fmt.Sprintf("%s/%v", ev.EventID, ev.Late))
	}
	if fmt.Sprint(got) != "[bad-a2/false a3/false bad-b2/true]" {
		t.Fatalf("replayed %v", got)
	}
	if rows := inboxRows(t, s.db); rows != "map[a1:processed false false a3:processed false false b1:processed false false b3:processed false false bad-a2:processed false false bad-b2:processed true false]" {
		t.Fatalf("rows %s", rows)
	}
}

// TestGapTimerDeadLettersFailingReleased: a parked event whose handler
// fails when the gap timer releases it rolls the give-up back (the gap
// stays open) until it has failed RetryMaxAttempts times; then the timer
// dead-letters it, applies the rest and gives the gap up. A replay then
// delivers it marked late.
func TestGapTimerDeadLettersFailingReleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	s.app.cfg.RetryMaxAttempts = 2
	s.app.handler = asBatch(HandlerFunc(func(_ context.Context, _ pgx.Tx, ev Event) error {
		if ev.EventID == "e3" {
			return errors.New("nope")
		}
		return s.rec.HandleBatch(ctx, nil, []Event{ev})
	}))
	if _, err := s.app.applyTx(ctx, items(rec("e1", 1, 0), rec("e3", 3, 1), rec("e4", 4, 2))); err != nil {
		t.Fatal(err)
	}
	g := s.app.guard.(*seqGuard)
	failures := map[string]int{}
	later := time.Now().Add(time.Hour)
	_, err := s.app.giveUpExpired(ctx, g, later, failures)
	var he *HandlerError
	if !errors.As(err, &he) || he.EventID != "e3" || failures["e3"] != 1 {
		t.Fatalf("first tick: %v, failures %v", err, failures)
	}
	if n := countRows(t, s.db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'open'`); n != 1 {
		t.Fatalf("%d open gaps after the failed tick, want 1", n)
	}
	out, err := s.app.giveUpExpired(ctx, g, later, failures)
	if err != nil || out.processed != 1 || out.dead != 1 || len(out.guard.givenUp) != 1 || len(out.deadReleased) != 1 {
		t.Fatalf("second tick: %+v %v", out, err)
	}
	if rows := inboxRows(t, s.db); rows != "map[e1:processed false false e3:dead false true e4:processed false false]" {
		t.Fatalf("rows %s", rows)
	}
	if res, err := Replay(ctx, s.db.Pool, "c1", s.rec, "e3"); err != nil || res != ReplayedLate {
		t.Fatalf("replay: %v %v", res, err)
	}
	var got []string
	for _, ev := range s.rec.got {
		got = append(got, fmt.Sprintf("%s/%v", ev.EventID, ev.Late))
	}
	if fmt.Sprint(got) != "[e1/false e4/false e3/true]" {
		t.Fatalf("applied %v", got)
	}
}

// TestIsolatedDeadLettersFailingReleased: an arriving event releases a
// parked one whose handler fails. The isolated path's last try dead-letters
// the released event in place (not the arriving one) and applies the
// arriving event; a replay then delivers the dead one marked late.
func TestIsolatedDeadLettersFailingReleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	s.app.cfg.RetryMaxAttempts = 2
	s.app.cfg.RetryInitialInterval, s.app.cfg.RetryMaxInterval = 1, 1
	s.app.handler = asBatch(HandlerFunc(func(_ context.Context, _ pgx.Tx, ev Event) error {
		if ev.EventID == "e3" {
			return errors.New("nope")
		}
		return s.rec.HandleBatch(ctx, nil, []Event{ev})
	}))
	if _, err := s.app.applyTx(ctx, items(rec("e1", 1, 0), rec("e3", 3, 1))); err != nil {
		t.Fatal(err)
	}
	errs := 0
	out, err := s.app.applyIsolated(ctx, items(rec("e2", 2, 2)), nil, func(error) { errs++ })
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 1 || out.dead != 1 || len(out.deadReleased) != 1 || out.deadReleased[0].EventID != "e3" || errs != 2 {
		t.Fatalf("out %+v, handler errors %d", out, errs)
	}
	if rows := inboxRows(t, s.db); rows != "map[e1:processed false false e2:processed false false e3:dead false true]" {
		t.Fatalf("rows %s", rows)
	}
	if res, err := Replay(ctx, s.db.Pool, "c1", s.rec, "e3"); err != nil || res != ReplayedLate {
		t.Fatalf("replay: %v %v", res, err)
	}
	var got []string
	for _, ev := range s.rec.got {
		got = append(got, fmt.Sprintf("%s/%v", ev.EventID, ev.Late))
	}
	// e2 ran in each rolled-back try too (the recorder is not transactional).
	if fmt.Sprint(got) != "[e1/false e2/false e2/false e2/false e3/true]" {
		t.Fatalf("handler runs %v", got)
	}
}

// TestReplayUsesGuardSettings: a replay goes through the sequence guard
// with the consumer's settings, not the defaults: a replayed event that
// parks opens its gap with its class's -gap-timeouts timeout, and the
// parked bound (-max-parked) gives a gap up early as in the consumer.
func TestReplayUsesGuardSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	s.app.cfg.RetryMaxAttempts = 1
	s.app.handler = asBatch(HandlerFunc(func(_ context.Context, _ pgx.Tx, ev Event) error {
		if strings.HasPrefix(ev.EventID, "bad") {
			return errors.New("nope")
		}
		return nil
	}))
	srcRec := func(src, id string, seq, offset int64) *kgo.Record {
		ev := envelope.Envelope{EventID: id, Source: src, Seq: seq, EventType: "billing.x", Payload: []byte(`{}`)}
		r := ev.Record("topic")
		r.Offset = offset
		return r
	}
	// r1 applied, bad-r3 dead (r2 never came); m1 applied, m3 parked
	// behind 2, bad-m4 dead. (The dead rows are written as the isolated
	// path writes them, without the guard.)
	if _, err := s.app.applyTx(ctx, items(srcRec("r", "r1", 1, 0), srcRec("m", "m1", 1, 2), srcRec("m", "m3", 3, 3))); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*kgo.Record{srcRec("r", "bad-r3", 3, 1), srcRec("m", "bad-m4", 4, 4)} {
		it := decodeItem(context.Background(), &wire.Decoder{}, r, 0, "")
		if _, err := s.app.deadLetterTx(ctx, &it, 1, "nope"); err != nil {
			t.Fatal(err)
		}
	}
	rc := ReplayConfig{ConsumerName: "c1", Handler: s.rec, Pool: s.db.Pool, MaxParked: 1,
		GapTimeouts: []GapTimeout{{Pattern: "billing.*", Timeout: 7 * time.Minute}}}
	if res, err := rc.Replay(ctx, "bad-r3"); err != nil || res != ReplayParked {
		t.Fatalf("replay bad-r3: %v %v", res, err)
	}
	var timeout time.Duration
	if err := s.db.Pool.QueryRow(ctx, `SELECT (extract(epoch FROM deadline - opened_at) * 1e9)::bigint FROM onceflow.seq_gaps
	    WHERE consumer = 'c1' AND source = 'r' AND state = 'open'`).Scan(&timeout); err != nil || timeout != 7*time.Minute {
		t.Fatalf("the gap the replay opened times out after %v (%v), want the class's 7m", timeout, err)
	}
	s.rec.got = nil
	if res, err := rc.Replay(ctx, "bad-m4"); err != nil || res != Replayed {
		t.Fatalf("replay bad-m4: %v %v", res, err)
	}
	var reason string
	if err := s.db.Pool.QueryRow(ctx, `SELECT give_up_reason FROM onceflow.seq_gaps WHERE consumer = 'c1' AND source = 'm' AND state = 'given_up'`).Scan(&reason); err != nil || reason != "max_parked" {
		t.Fatalf("gap of m: reason %q, %v; want given up for max_parked", reason, err)
	}
	var got []string
	for _, ev := range s.rec.got {
		got = append(got, ev.EventID)
	}
	if fmt.Sprint(got) != "[m3 bad-m4]" {
		t.Fatalf("replay applied %v, want [m3 bad-m4]", got)
	}
}

// TestProbeNeverRunsAGenericPlan: the statements that probe the consumer's
// partitions for a batch's keys (the insert, and the read-only check of a
// batch of redeliveries) are planned for their arguments at every batch. As
// prepared statements they switched to a generic plan after five
// executions, and the one made while the partitions were nearly empty read
// each partition whole at every later batch (drains of 100k events fell
// from 36k to 3–4k events/s). One connection applies twelve batches and
// twelve redeliveries; no statement of its session that reads the inbox's
// partitions may have run a generic plan.
func TestProbeNeverRunsAGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	pc, err := pgxpool.ParseConfig(s.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s.app.cfg.Pool = pool
	var seq, off int64
	for b := range 12 {
		var batch []*kgo.Record
		for range 5 {
			seq++
			off++
			batch = append(batch, rec(fmt.Sprintf("g-%d", seq), seq, off))
		}
		if _, err := s.app.applyTx(ctx, items(batch...)); err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		// The same records again: the read-only probe of redeliveries.
		if _, err := s.app.applyTx(ctx, items(batch...)); err != nil {
			t.Fatalf("redelivery of batch %d: %v", b, err)
		}
	}
	var generic, statements int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0), count(*) FROM pg_prepared_statements
		WHERE statement LIKE '%FROM onceflow.inbox k%' AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&generic, &statements); err != nil {
		t.Fatal(err)
	}
	if generic > 0 {
		var which []string
		rows, err := pool.Query(ctx, `SELECT left(regexp_replace(statement, '\s+', ' ', 'g'), 200) FROM pg_prepared_statements
			WHERE statement LIKE '%FROM onceflow.inbox k%' AND statement NOT LIKE '%pg_prepared_statements%' AND generic_plans > 0`)
		if err == nil {
			which, _ = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		t.Fatalf("%d prepared statement(s) probing the inbox ran %d generic plan(s): %q", statements, generic, which)
	}
}

// TestProbeReadsOnlyTheBatchKeys: the dedup probes (the insert's and the
// read-only check of redeliveries) find a batch's keys one by one, however
// stale the partitions' statistics. With statistics taken while the inbox
// was empty (a fresh consumer draining a backlog: autovacuum analyzes a
// minute later at best), a probe of "event_id = ANY(batch)" was planned as
// a scan of every row of the consumer with the keys as a filter, so each
// batch read the whole inbox (31 ms a batch at 100k rows in the consumer
// drain, growing with the inbox; session 14). The probes may read no more
// inbox rows than the batch has keys.
func TestProbeReadsOnlyTheBatchKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	consumer := s.app.cfg.ConsumerName
	if _, err := s.db.Pool.Exec(ctx, `VACUUM ANALYZE onceflow.inbox`); err != nil {
		t.Fatal(err)
	}
	const inboxRows, batch = 100_000, 500
	if _, err := s.db.Pool.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status)
SELECT $1, 'old-' || g, 's' || (g % 100), g, 't', 'topic', 0, g, 'processed' FROM generate_series(1, $2::int) g`, consumer, inboxRows); err != nil {
		t.Fatal(err)
	}
	probe, err := s.app.lanes.probeLanes(ctx, s.db.Pool, consumer)
	if err != nil {
		t.Fatal(err)
	}
	// Half the batch is known (redeliveries), half is new.
	ids := make([]string, batch)
	sources, types, producers, lanes := make([]string, batch), make([]string, batch), make([]string, batch), make([]string, batch)
	seqs, offsets := make([]int64, batch), make([]int64, batch)
	for i := range ids {
		if i%2 == 0 {
			ids[i] = fmt.Sprintf("old-%d", 1000+i)
		} else {
			ids[i] = fmt.Sprintf("new-%d", i)
		}
		sources[i], types[i], lanes[i] = "s", "t", "legacy"
		seqs[i], offsets[i] = int64(inboxRows+i+1), int64(inboxRows+i+1)
	}
	known, insert := probeStatements(t, s, probe)
	for _, c := range []struct {
		name string
		q    string
		args []any
	}{
		{"read-only probe (qKnown)", known, []any{consumer, ids, batchFloor(ids)}},
		{"insert's probe (qInsertBatch)", insert, []any{consumer, "topic", int32(0), ids, sources, seqs, types, offsets,
			"g", int64(inboxRows + batch + 1), nil, producers, lanes, idFloors(ids), batchFloor(ids), ids, []string{}}},
	} {
		read := testkit.RowsRead(t, s.db.Pool, "inbox", c.q, c.args...)
		if read > batch {
			t.Errorf("%s read %v inbox rows for a batch of %d keys (inbox of %d rows)", c.name, read, batch, inboxRows)
		}
	}
}

// TestProbeReadsOnlyItsConsumersPartitions: the batch probes read the
// probing consumer's partitions only, never another consumer name's
// buckets of the same lanes (many services may share one database). Written
// as one filter "(lane = 'l1' AND consumer = $1 OR …)", PostgreSQL factored
// the consumer out of the arms and pruned by lane alone: every consumer's
// buckets of those lanes were read for every id.
func TestProbeReadsOnlyItsConsumersPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	consumer := s.app.cfg.ConsumerName
	for _, c := range []string{consumer, "other"} {
		if _, err := s.db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox_lanes (consumer, event_type, lane) VALUES ($1, 't', 'ttl-86400s')`, c); err != nil {
			t.Fatal(err)
		}
		for _, l := range []string{"ttl-86400s", "permanent"} {
			if _, err := s.db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets($1, $2)`, c, l); err != nil {
				t.Fatal(err)
			}
		}
	}
	others := map[string]bool{}
	rows, err := s.db.Pool.Query(ctx, `SELECT relname FROM onceflow.inbox_buckets WHERE consumer = 'other'`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) < 2 {
		t.Fatalf("other consumer's buckets: %v, %v", names, err)
	}
	for _, n := range names {
		others[n] = true
	}
	probe, err := s.app.lanes.probeLanes(ctx, s.db.Pool, consumer)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(probe, "ttl-86400s") {
		t.Fatalf("probe lanes %v, want the ttl lane", probe)
	}
	ids := []string{"a", "b", "c"}
	known, insert := probeStatements(t, s, probe)
	three := func(v string) []string { return []string{v, v, v} }
	for _, c := range []struct {
		name string
		q    string
		args []any
	}{
		{"read-only probe (qKnown)", known, []any{consumer, ids, batchFloor(ids)}},
		{"insert's probe (qInsertBatch)", insert, []any{consumer, "topic", int32(0), ids, three("s"), []int64{1, 2, 3}, three("t"),
			[]int64{1, 2, 3}, "g", int64(4), nil, three(""), three("ttl-86400s"), idFloors(ids), batchFloor(ids), ids, []string{}}},
	} {
		read := testkit.ExplainAnalyze(t, s.db.Pool, c.q, c.args...).Relations()
		for rel := range read {
			if others[rel] {
				t.Errorf("%s read %s, a partition of another consumer (read: %v)", c.name, rel, read)
			}
		}
	}
}

// idFloors are the keys' id floors.
func idFloors(ids []string) []pgtype.Timestamptz {
	out := make([]pgtype.Timestamptz, len(ids))
	for i, id := range ids {
		out[i] = idFloor(id)
	}
	return out
}

// probeStatements are the read-only probe and the batch insert written for
// the lanes.
func probeStatements(t *testing.T, s applySetup, lanes []string) (known, insert string) {
	t.Helper()
	since, err := s.app.lanes.idTimeSince(context.Background(), s.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	known, err = withLanes(qKnown, lanes, since)
	if err != nil {
		t.Fatal(err)
	}
	if insert, err = insertStatement(lanes, since, nil, true, false); err != nil {
		t.Fatal(err)
	}
	return known, insert
}
