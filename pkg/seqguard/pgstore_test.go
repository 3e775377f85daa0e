package seqguard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

const consumer = "test"

type bundle struct {
	db    *testkit.DB
	store *seqguard.PGStore
}

// legacy is the legacy streams of sources.
func legacy(sources ...string) []seqguard.Stream {
	out := make([]seqguard.Stream, len(sources))
	for i, s := range sources {
		out[i] = seqguard.Stream{Source: s}
	}
	return out
}

// lastAppliedSQL is the last_applied of seq_state row s: the greater of its
// floor and its newest seq_applied row.
const lastAppliedSQL = `greatest(s.last_applied, (SELECT max(a.last_applied) FROM onceflow.seq_applied a
    WHERE a.consumer = s.consumer AND a.source = s.source AND a.producer = s.producer AND a.topic = s.topic))`

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{db: testkit.NewDB(t), store: &seqguard.PGStore{Consumer: consumer}}
}

func event(source string, seq int64) seqguard.Event {
	return seqguard.Event{
		EventID:   fmt.Sprintf("%s-%d", source, seq),
		Source:    source,
		Seq:       seq,
		EventType: "order.updated",
		Topic:     "orders",
		Partition: 3,
		Offset:    100 + seq,
		Headers:   json.RawMessage(fmt.Sprintf(`{"n": "%d"}`, seq)),
		Payload:   []byte(fmt.Sprintf("payload %d", seq)),
	}
}

// deliver does what the consumer does for a batch: in one transaction it
// inserts the inbox rows (as processed, no payload), locks the sources and
// runs the guard for each event. It returns the handler runs owed.
func (b *bundle) deliver(t *testing.T, pool *pgxpool.Pool, now time.Time, p seqguard.Policy, evs ...seqguard.Event) []seqguard.Outcome {
	t.Helper()
	ctx := context.Background()
	var outs []seqguard.Outcome
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var srcs []seqguard.Stream
		for _, ev := range evs {
			if _, err := tx.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, producer)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'processed', $9, $10)`,
				consumer, ev.EventID, ev.Source, ev.Seq, ev.EventType, ev.Topic, ev.Partition, ev.Offset, now, ev.Producer); err != nil {
				return err
			}
			srcs = append(srcs, ev.Stream())
		}
		l, err := b.store.Lock(ctx, tx, srcs, now)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			out, err := l.Receive(ctx, ev, now, p)
			if err != nil {
				return err
			}
			outs = append(outs, out)
		}
		return l.Flush(ctx) // a no-op unless the store defers
	})
	if err != nil {
		t.Fatalf("deliver: %v", err)
	}
	return outs
}

func (b *bundle) giveUp(t *testing.T, pool *pgxpool.Pool, now time.Time) []seqguard.Outcome {
	t.Helper()
	var outs []seqguard.Outcome
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		outs, err = b.store.GiveUpExpired(context.Background(), tx, now, 0)
		return err
	})
	if err != nil {
		t.Fatalf("GiveUpExpired: %v", err)
	}
	return outs
}

// applied renders the handler runs: "4", "5p" (parked), "7L" (late).
func applied(outs ...seqguard.Outcome) []string {
	var s []string
	for _, o := range outs {
		for _, a := range o.Apply {
			r := fmt.Sprint(a.Event.Seq)
			if !a.Current {
				r += "p"
			}
			if a.Late {
				r += "L"
			}
			s = append(s, r)
		}
	}
	return s
}

func givenUp(outs ...seqguard.Outcome) []string {
	var s []string
	for _, o := range outs {
		for _, g := range o.GivenUp() {
			s = append(s, fmt.Sprintf("%s %v %s", o.Stream.Source, g.Gap, g.Reason))
		}
	}
	return s
}

func inboxRow(t *testing.T, q seqguard.Querier, eventID string) (status string, late bool, payload []byte) {
	t.Helper()
	if err := q.QueryRow(context.Background(),
		`SELECT status, late, payload FROM onceflow.inbox WHERE consumer = $1 AND event_id = $2`, consumer, eventID).
		Scan(&status, &late, &payload); err != nil {
		t.Fatalf("inbox row %s: %v", eventID, err)
	}
	return status, late, payload
}

func gapRows(t *testing.T, q seqguard.Querier, source string) []string {
	t.Helper()
	rows, err := q.Query(context.Background(), `
SELECT from_seq, to_seq, state, coalesce(give_up_reason, ''), opened_at, deadline FROM onceflow.seq_gaps
WHERE consumer = $1 AND source = $2 ORDER BY from_seq, id`, consumer, source)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	var from, to int64
	var state, reason string
	var opened, deadline time.Time
	if _, err := pgx.ForEachRow(rows, []any{&from, &to, &state, &reason, &opened, &deadline}, func() error {
		out = append(out, fmt.Sprintf("%d-%d %s%s opened+%s deadline+%s", from, to, state, reason,
			opened.Sub(t0), deadline.Sub(t0)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func seqs(evs ...int64) []seqguard.Event {
	var out []seqguard.Event
	for _, s := range evs {
		out = append(out, event("acct-1", s))
	}
	return out
}

var def = seqguard.Policy{}

// 5 before 4: 5 is parked durably, then 4 and 5 apply in order and nothing
// is given up.
func TestPGStoreOutOfOrderParksThenApplies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := b.db.Pool
	b.deliver(t, pool, at(0), def, seqs(1, 2, 3)...)
	outs := b.deliver(t, pool, at(1), def, seqs(5)...)
	if got := applied(outs...); len(got) != 0 {
		t.Fatalf("5 applied early: %v", got)
	}
	if status, _, payload := inboxRow(t, pool, "acct-1-5"); status != "parked" || string(payload) != "payload 5" {
		t.Fatalf("5: status %s payload %q, want parked with payload", status, payload)
	}
	outs = b.deliver(t, pool, at(2), def, seqs(4)...)
	if got, want := applied(outs...), []string{"4", "5p"}; !slices.Equal(got, want) {
		t.Fatalf("applied %v, want %v", got, want)
	}
	five := outs[0].Apply[1].Event
	if want := event("acct-1", 5); five.EventID != want.EventID || string(five.Payload) != "payload 5" ||
		five.Topic != "orders" || five.Partition != 3 || five.Offset != 105 || five.EventType != want.EventType {
		t.Errorf("parked event returned as %+v", five)
	}
	var hdr map[string]string
	if err := json.Unmarshal(five.Headers, &hdr); err != nil || hdr["n"] != "5" {
		t.Errorf("parked headers %s: %v", five.Headers, err)
	}
	if status, _, payload := inboxRow(t, pool, "acct-1-5"); status != "processed" || payload != nil {
		t.Errorf("5 after apply: status %s payload %q, want processed without payload", status, payload)
	}
	if got, want := gapRows(t, pool, "acct-1"), []string{"4-4 filled opened+1s deadline+31s"}; !slices.Equal(got, want) {
		t.Errorf("gaps %v, want %v", got, want)
	}
	if outs := b.giveUp(t, pool, at(1000)); len(outs) != 0 {
		t.Errorf("timer after the fill: %v", givenUp(outs...))
	}
}

// Seq 7 never arrives: after the timeout the gap is given up once and 8-10
// apply in order; 7 arriving afterwards follows the late policy.
func TestPGStoreGapTimeoutAndLate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		late       seqguard.Late
		wantApply  []string
		wantStatus string
		wantHeld   int64
	}{
		{seqguard.DeliverLate, []string{"7L"}, "processed", 0},
		{seqguard.Hold, nil, "held", 1},
	}
	for _, tc := range cases {
		t.Run(tc.late.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			pool := b.db.Pool
			p := seqguard.Policy{Late: tc.late, GapTimeout: 10 * time.Second}
			b.deliver(t, pool, at(0), p, seqs(1, 2, 3, 4, 5, 6)...)
			b.deliver(t, pool, at(1), p, seqs(8, 9)...)
			b.deliver(t, pool, at(2), p, seqs(10)...)
			if outs := b.giveUp(t, pool, at(10)); len(outs) != 0 {
				t.Fatalf("given up before the deadline: %v", givenUp(outs...))
			}
			outs := b.giveUp(t, pool, at(11))
			if got, want := givenUp(outs...), []string{"acct-1 7-7 timeout"}; !slices.Equal(got, want) {
				t.Fatalf("given up %v, want %v", got, want)
			}
			if got, want := applied(outs...), []string{"8p", "9p", "10p"}; !slices.Equal(got, want) {
				t.Fatalf("applied %v, want %v", got, want)
			}
			if outs := b.giveUp(t, pool, at(100)); len(outs) != 0 {
				t.Fatalf("given up twice: %v", givenUp(outs...))
			}
			if got, want := gapRows(t, pool, "acct-1"), []string{"7-7 given_uptimeout opened+1s deadline+11s"}; !slices.Equal(got, want) {
				t.Errorf("gaps %v, want %v", got, want)
			}
			outs = b.deliver(t, pool, at(200), p, seqs(7)...)
			if got := applied(outs...); !slices.Equal(got, tc.wantApply) {
				t.Errorf("late 7 applied %v, want %v", got, tc.wantApply)
			}
			status, late, payload := inboxRow(t, pool, "acct-1-7")
			if status != tc.wantStatus || !late {
				t.Errorf("late 7: status %s late %v, want %s late", status, late, tc.wantStatus)
			}
			if tc.late == seqguard.Hold && string(payload) != "payload 7" {
				t.Errorf("held 7 lost its payload: %q", payload)
			}
			st, err := b.store.Stats(context.Background(), pool, at(300))
			if err != nil {
				t.Fatal(err)
			}
			if want := (seqguard.Stats{Held: tc.wantHeld}); st != want {
				t.Errorf("stats %+v, want %+v", st, want)
			}
		})
	}
}

// A fill inside a gap splits its row; both pieces keep opened_at and deadline.
func TestPGStoreGapSplit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := b.db.Pool
	b.deliver(t, pool, at(0), def, seqs(8)...)
	b.deliver(t, pool, at(5), def, seqs(5)...)
	want := []string{"1-4 open opened+0s deadline+30s", "6-7 open opened+0s deadline+30s"}
	if got := gapRows(t, pool, "acct-1"); !slices.Equal(got, want) {
		t.Fatalf("gaps %v, want %v", got, want)
	}
	outs := b.deliver(t, pool, at(6), def, seqs(1, 2, 3, 4, 6, 7)...)
	if got, want := applied(outs...), []string{"1", "2", "3", "4", "5p", "6", "7", "8p"}; !slices.Equal(got, want) {
		t.Fatalf("applied %v, want %v", got, want)
	}
	// Rows narrow as seqs arrive; a filled row keeps the last seq it waited for.
	want = []string{"4-4 filled opened+0s deadline+30s", "7-7 filled opened+0s deadline+30s"}
	if got := gapRows(t, pool, "acct-1"); !slices.Equal(got, want) {
		t.Fatalf("gaps %v, want %v", got, want)
	}
}

// Two timers (two pools, several goroutines) racing for one expired gap:
// exactly one gives it up.
func TestPGStoreConcurrentTimersGiveUpOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.deliver(t, b.db.Pool, at(0), def, seqs(1, 3, 4)...)
	other, err := pgxpool.New(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)

	// First, deterministically: while one timer's transaction holds the
	// source, another skips it; after the commit, the other finds nothing.
	txA, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	outsA, err := b.store.GiveUpExpired(ctx, txA, at(30), 0)
	if err != nil {
		t.Fatal(err)
	}
	if outsB := b.giveUp(t, other, at(30)); len(outsB) != 0 {
		t.Fatalf("second timer gave up %v while the first held the source", givenUp(outsB...))
	}
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := givenUp(outsA...), []string{"acct-1 2-2 timeout"}; !slices.Equal(got, want) {
		t.Fatalf("first timer gave up %v, want %v", got, want)
	}
	if outsB := b.giveUp(t, other, at(31)); len(outsB) != 0 {
		t.Fatalf("second timer gave up %v after the first committed", givenUp(outsB...))
	}

	// Then a free-for-all over several sources.
	var evs []seqguard.Event
	for i := range 10 {
		e := event(fmt.Sprintf("src-%02d", i), 2)
		evs = append(evs, e)
	}
	b.deliver(t, b.db.Pool, at(100), def, evs...)
	var (
		mu    sync.Mutex
		all   []string
		start = make(chan struct{})
		wg    sync.WaitGroup
	)
	for i := range 8 {
		pool := b.db.Pool
		if i%2 == 1 {
			pool = other
		}
		wg.Go(func() {
			<-start
			for range 3 {
				var outs []seqguard.Outcome
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					outs, err = b.store.GiveUpExpired(ctx, tx, at(200), 3)
					return err
				})
				if err != nil {
					t.Errorf("timer: %v", err)
					return
				}
				mu.Lock()
				all = append(all, givenUp(outs...)...)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	// Whatever the race left, a last run finishes it.
	all = append(all, givenUp(b.giveUp(t, b.db.Pool, at(200))...)...)
	slices.Sort(all)
	var want []string
	for i := range 10 {
		want = append(want, fmt.Sprintf("src-%02d 1-1 timeout", i))
	}
	if !slices.Equal(all, want) {
		t.Fatalf("given up %v, want each once: %v", all, want)
	}
	var n int
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`).Scan(&n); err != nil || n != 11 {
		t.Fatalf("given_up rows %d (%v), want 11", n, err)
	}
}

// State lives in Postgres only: a new pool (a restarted consumer) finds the
// parked events and open gap, and the timer still gives it up once.
func TestPGStoreSurvivesRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	first, err := pgxpool.New(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	b.deliver(t, first, at(0), def, seqs(1, 2, 4, 5)...)
	first.Close() // "SIGKILL"

	again := &bundle{db: b.db, store: &seqguard.PGStore{Consumer: consumer}}
	second, err := pgxpool.New(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Close)
	err = pgx.BeginFunc(ctx, second, func(tx pgx.Tx) error {
		l, err := again.store.Lock(ctx, tx, legacy("acct-1"), at(1))
		if err != nil {
			return err
		}
		st, _ := l.State(seqguard.Stream{Source: "acct-1"})
		if st.LastApplied != 2 || !slices.Equal(st.Parked, []int64{4, 5}) || len(st.Gaps) != 1 || st.Gaps[0].From != 3 ||
			!st.Gaps[0].Deadline.Equal(at(30)) {
			t.Errorf("state after restart %+v", st)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	outs := again.giveUp(t, second, at(30))
	if got, want := applied(outs...), []string{"4p", "5p"}; !slices.Equal(got, want) {
		t.Fatalf("applied %v, want %v", got, want)
	}
	if got := givenUp(again.giveUp(t, second, at(60))...); len(got) != 0 {
		t.Fatalf("given up again: %v", got)
	}
}

// Batches locking the same sources in opposite orders do not deadlock; the
// sources of a key change spread over two partitions stay in seq order.
func TestPGStoreLockOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	order := map[string][]string{}
	for w := range 4 {
		wg.Go(func() {
			for i := range 10 {
				seq := int64(w*10 + i + 1)
				srcs := []string{"a", "b", "c"}
				if w%2 == 1 {
					slices.Reverse(srcs)
				}
				var evs []seqguard.Event
				for _, s := range srcs {
					e := event(s, seq)
					evs = append(evs, e)
				}
				var outs []seqguard.Outcome
				tx, err := b.db.Pool.Begin(ctx)
				if err != nil {
					t.Errorf("worker %d: %v", w, err)
					return
				}
				err = func() error {
					for _, ev := range evs {
						if _, err := tx.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status)
VALUES ($1, $2, $3, $4, 't', 'x', $5, 0, 'processed')`, consumer, ev.EventID, ev.Source, ev.Seq, w); err != nil {
							return err
						}
					}
					l, err := b.store.Lock(ctx, tx, legacy(srcs...), at(0))
					if err != nil {
						return err
					}
					for _, ev := range evs {
						out, err := l.Receive(ctx, ev, at(0), seqguard.Policy{MaxParked: 100})
						if err != nil {
							return err
						}
						outs = append(outs, out)
					}
					return nil
				}()
				if err != nil {
					_ = tx.Rollback(ctx)
					t.Errorf("worker %d: %v", w, err)
					return
				}
				// The commit and the record of what it applied under one
				// lock: the record's order is the commit order (recorded
				// after the commit, another worker's later commit could be
				// recorded first).
				mu.Lock()
				err = tx.Commit(ctx)
				for _, o := range outs {
					order[o.Stream.Source] = append(order[o.Stream.Source], applied(o)...)
				}
				mu.Unlock()
				if err != nil {
					t.Errorf("worker %d: commit: %v", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, s := range []string{"a", "b", "c"} {
		var want []string
		for i := range 40 {
			want = append(want, fmt.Sprint(i+1))
		}
		got := slices.Clone(order[s])
		for i := range got { // strip the parked marker: order is what matters
			got[i] = trimP(got[i])
		}
		if !slices.Equal(got, want) {
			t.Errorf("source %s applied %v", s, order[s])
		}
	}
}

func trimP(s string) string {
	if len(s) > 0 && s[len(s)-1] == 'p' {
		return s[:len(s)-1]
	}
	return s
}

// A parked bound gives the lowest gap up early, inside the batch.
func TestPGStoreMaxParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := seqguard.Policy{MaxParked: 2}
	b.deliver(t, b.db.Pool, at(0), p, seqs(3, 4)...)
	outs := b.deliver(t, b.db.Pool, at(1), p, seqs(6)...)
	if got, want := givenUp(outs...), []string{"acct-1 1-2 max_parked"}; !slices.Equal(got, want) {
		t.Fatalf("given up %v, want %v", got, want)
	}
	if got, want := applied(outs...), []string{"3p", "4p"}; !slices.Equal(got, want) {
		t.Fatalf("applied %v, want %v", got, want)
	}
	if got, want := gapRows(t, b.db.Pool, "acct-1"), []string{
		"1-2 given_upmax_parked opened+0s deadline+30s", "5-5 open opened+1s deadline+31s"}; !slices.Equal(got, want) {
		t.Errorf("gaps %v, want %v", got, want)
	}
}

func TestPGStoreFirstSeenPolicies(t *testing.T) {
	t.Parallel()
	cases := []struct {
		first seqguard.FirstSeen
		want  []string
	}{
		{seqguard.ExpectFirstSeq1, nil},
		{seqguard.AcceptFirstSeen, []string{"5"}},
	}
	for _, tc := range cases {
		t.Run(tc.first.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			outs := b.deliver(t, b.db.Pool, at(0), seqguard.Policy{FirstSeen: tc.first}, seqs(5)...)
			if got := applied(outs...); !slices.Equal(got, tc.want) {
				t.Errorf("applied %v, want %v", got, tc.want)
			}
		})
	}
}

// A source locked but never received for stays "not started", so the start
// policy still applies to its first event.
func TestPGStoreLockWithoutReceive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := b.store.Lock(ctx, tx, legacy("acct-1"), at(0))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	outs := b.deliver(t, b.db.Pool, at(1), seqguard.Policy{FirstSeen: seqguard.AcceptFirstSeen}, seqs(9)...)
	if got := applied(outs...); !slices.Equal(got, []string{"9"}) {
		t.Errorf("applied %v, want [9]", got)
	}
}

func TestPGStoreReceiveErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		l, err := b.store.Lock(ctx, tx, legacy("acct-1"), at(0))
		if err != nil {
			return err
		}
		if _, err := l.Receive(ctx, event("other", 1), at(0), def); !errors.Is(err, seqguard.ErrNotLocked) {
			t.Errorf("unlocked source: %v, want ErrNotLocked", err)
		}
		// No inbox row for the event: parking must fail loudly.
		if _, err := l.Receive(ctx, event("acct-1", 3), at(0), def); err == nil {
			t.Error("parking an event without its inbox row succeeded")
		}
		return errors.New("rollback")
	})
	if err == nil || err.Error() != "rollback" {
		t.Fatal(err)
	}
}

func TestPGStoreOperatorFunctions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool := b.db.Pool
	b.deliver(t, pool, at(0), def, seqs(3)...)                             // gap 1-2
	b.deliver(t, pool, at(0), def, event("acct-2", 2), event("acct-2", 5)) // gaps 1-1, 3-4
	b.giveUp(t, pool, at(30))
	b.deliver(t, pool, at(40), def, event("acct-2", 8)) // gap 6-7, opened at 40

	st, err := b.store.Stats(ctx, pool, at(50))
	if err != nil {
		t.Fatal(err)
	}
	if want := (seqguard.Stats{OpenGaps: 1, OldestOpenGapAge: 10 * time.Second, Parked: 1}); st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	list := func(include bool, since time.Time) []string {
		t.Helper()
		gaps, err := b.store.ListGaps(ctx, pool, include, since)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, g := range gaps {
			out = append(out, fmt.Sprintf("%s %d-%d %s%s%s", g.Source, g.From, g.To, g.State, g.Reason, g.ResolvedNote))
		}
		return out
	}
	if got, want := list(false, time.Time{}), []string{"acct-2 6-7 open"}; !slices.Equal(got, want) {
		t.Errorf("open gaps %v, want %v", got, want)
	}
	all := []string{"acct-2 6-7 open", "acct-1 1-2 given_uptimeout", "acct-2 1-1 given_uptimeout", "acct-2 3-4 given_uptimeout"}
	if got := list(true, at(0)); !slices.Equal(got, all) {
		t.Errorf("gaps %v, want %v", got, all)
	}
	if n, err := b.store.ResolveGap(ctx, pool, seqguard.Stream{Source: "acct-2"}, 1, 4, "replayed from the ledger", at(60)); err != nil || n != 2 {
		t.Fatalf("resolve: %d, %v", n, err)
	}
	if _, err := b.store.ResolveGap(ctx, pool, seqguard.Stream{Source: "acct-2"}, 1, 4, "again", at(61)); !errors.Is(err, seqguard.ErrGapNotFound) {
		t.Errorf("resolve twice: %v, want ErrGapNotFound", err)
	}
	if _, err := b.store.ResolveGap(ctx, pool, seqguard.Stream{Source: "acct-1"}, 1, 2, "", at(61)); err == nil {
		t.Error("resolve without a note succeeded")
	}
	// Resolved gaps given up before since drop out of the list.
	if got, want := list(true, at(35)), []string{"acct-2 6-7 open", "acct-1 1-2 given_uptimeout"}; !slices.Equal(got, want) {
		t.Errorf("gaps %v, want %v", got, want)
	}
	if got, want := list(true, at(0))[2:], []string{"acct-2 1-1 given_uptimeoutreplayed from the ledger", "acct-2 3-4 given_uptimeoutreplayed from the ledger"}; !slices.Equal(got, want) {
		t.Errorf("resolved gaps %v, want %v", got, want)
	}
}

// Two event ids claiming one parked seq: the second is held, not dropped.
func TestPGStoreSeqConflictIsHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.deliver(t, b.db.Pool, at(0), def, seqs(2)...)
	other := event("acct-1", 2)
	other.EventID = "impostor"
	outs := b.deliver(t, b.db.Pool, at(1), def, other)
	if got := applied(outs...); len(got) != 0 {
		t.Fatalf("applied %v", got)
	}
	if status, late, payload := inboxRow(t, b.db.Pool, "impostor"); status != "held" || late || string(payload) != "payload 2" {
		t.Errorf("conflicting event: status %s late %v payload %q, want held with payload", status, late, payload)
	}
	if c := seqguard.Count(outs[0].Steps); c.Held != 1 {
		t.Errorf("counts %+v, want one held", c)
	}
}

// TestPGStoreDeferInOrder: with DeferInOrder an in-order Receive writes
// nothing until Flush; any other step writes the pending state with it; the
// stored state ends up exactly as without deferral.
func TestPGStoreDeferInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.store.DeferInOrder = true
	p := seqguard.Policy{}
	last := func(q seqguard.Querier, src string) int64 {
		t.Helper()
		var n *int64
		if err := q.QueryRow(ctx, `SELECT `+lastAppliedSQL+` FROM onceflow.seq_state s WHERE consumer = $1 AND source = $2`, consumer, src).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == nil {
			return -1
		}
		return *n
	}
	b.deliver(t, b.db.Pool, at(0), p, event("a", 1), event("a", 2), event("b", 1), event("a", 3))
	if a, bb := last(b.db.Pool, "a"), last(b.db.Pool, "b"); a != 3 || bb != 1 {
		t.Fatalf("after flush: a %d b %d", a, bb)
	}
	// 4 in order (deferred), then 6 parks: the park writes 4 with it.
	b.deliver(t, b.db.Pool, at(1), p, event("a", 4), event("a", 6))
	if a := last(b.db.Pool, "a"); a != 4 {
		t.Fatalf("after park: a %d", a)
	}
	outs := b.deliver(t, b.db.Pool, at(2), p, event("a", 5))
	if len(outs[0].Apply) != 2 || last(b.db.Pool, "a") != 6 {
		t.Fatalf("release: %+v, a %d", outs, last(b.db.Pool, "a"))
	}
	// Inside a transaction: nothing written until Flush.
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		ev := event("a", 7)
		if _, err := tx.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'processed', now())`, consumer, ev.EventID, ev.Source, ev.Seq, ev.EventType, ev.Topic, ev.Partition, ev.Offset); err != nil {
			return err
		}
		l, err := b.store.Lock(ctx, tx, legacy("a"), at(3))
		if err != nil {
			return err
		}
		if _, err := l.Receive(ctx, ev, at(3), p); err != nil {
			return err
		}
		if a := last(tx, "a"); a != 6 {
			t.Errorf("before Flush: a %d, want 6 (deferred)", a)
		}
		if err := l.Flush(ctx); err != nil {
			return err
		}
		if a := last(tx, "a"); a != 7 {
			t.Errorf("after Flush: a %d, want 7", a)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sev is event(source, seq) of producer on topic (producer "": a legacy
// stream's event), with an event id unique across streams.
func sev(producer, topic, source string, seq int64) seqguard.Event {
	e := event(source, seq)
	e.Producer, e.Topic = producer, topic
	e.EventID = fmt.Sprintf("%s/%s/%s-%d", producer, topic, source, seq)
	return e
}

// Streams are ordered apart: two producers of one source name, and one
// producer's source on two topics, never count each other's seqs as
// duplicates, never park behind each other's gaps, and a gap given up is
// its own stream's only. A legacy stream stays one stream across topics.
func TestStreamsAreIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := seqguard.Policy{GapTimeout: 10 * time.Second}
	pool := b.db.Pool
	// A's order-1: 1, 2. B's order-1: 1, 3 (parks behind 2).
	got := applied(b.deliver(t, pool, at(0), p,
		sev("A", "orders", "order-1", 1), sev("B", "orders", "order-1", 1), sev("A", "orders", "order-1", 2),
		sev("B", "orders", "order-1", 3))...)
	if strings.Join(got, ",") != "1,1,2" {
		t.Fatalf("applied %v, want A 1, B 1, A 2 (B 3 parked)", got)
	}
	// A's order-1 on emails starts at 1 of its own; A's orders stream goes on.
	got = applied(b.deliver(t, pool, at(1), p, sev("A", "emails", "order-1", 1), sev("A", "orders", "order-1", 3))...)
	if strings.Join(got, ",") != "1,3" {
		t.Fatalf("applied %v, want emails 1 and orders 3", got)
	}
	// A legacy stream of the same source is one more stream, across topics.
	got = applied(b.deliver(t, pool, at(2), p, sev("", "orders", "order-1", 1), sev("", "emails", "order-1", 2))...)
	if strings.Join(got, ",") != "1,2" {
		t.Fatalf("legacy: applied %v, want 1,2", got)
	}
	// B's gap is given up alone, and releases only B's parked 3.
	outs := b.giveUp(t, pool, at(30))
	if g := givenUp(outs...); len(g) != 1 || outs[0].Stream != (seqguard.Stream{Producer: "B", Topic: "orders", Source: "order-1"}) {
		t.Fatalf("given up %v (%+v), want B's 2-2 only", g, outs)
	}
	if got := applied(outs...); strings.Join(got, ",") != "3p" {
		t.Fatalf("released %v, want B's 3", got)
	}
	gaps, err := b.store.ListGaps(context.Background(), pool, true, time.Time{})
	if err != nil || len(gaps) != 1 || gaps[0].Producer != "B" || gaps[0].Topic != "orders" {
		t.Fatalf("ListGaps = %+v, %v; want B's gap with its producer and topic", gaps, err)
	}
	if _, err := b.store.ResolveGap(context.Background(), pool, seqguard.Stream{Source: "order-1"}, 2, 2, "x", at(40)); !errors.Is(err, seqguard.ErrGapNotFound) {
		t.Fatalf("resolving the legacy stream's 2-2: %v, want not found (the gap is B's)", err)
	}
	if n, err := b.store.ResolveGap(context.Background(), pool, gaps[0].Stream(), 2, 2, "x", at(40)); err != nil || n != 1 {
		t.Fatalf("resolving B's 2-2: %d, %v", n, err)
	}
}

// A producer's stream adopts its source's legacy state on its first event
// when that event lies above it (the upgrade: no gap), and starts by the
// start policy when it does not (another producer that shared the source
// name). Adoption is written: a later transaction sees it.
func TestStreamAdoptsLegacyState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := seqguard.Policy{GapTimeout: 10 * time.Second}
	pool := b.db.Pool
	b.deliver(t, pool, at(0), p, sev("", "orders", "s", 1), sev("", "orders", "s", 2), sev("", "orders", "s", 3))
	// In order after the legacy 3, with the store deferring (as the consumer does).
	b.store.DeferInOrder = true
	if got := applied(b.deliver(t, pool, at(1), p, sev("P", "orders", "s", 4))...); strings.Join(got, ",") != "4" {
		t.Fatalf("P's first event: applied %v, want 4", got)
	}
	b.store.DeferInOrder = false
	if got := applied(b.deliver(t, pool, at(2), p, sev("P", "orders", "s", 5))...); strings.Join(got, ",") != "5" {
		t.Fatalf("P's second event: applied %v, want 5", got)
	}
	// Above with a hole: adopted, and the hole is a gap of P's stream.
	outs := b.deliver(t, pool, at(3), p, sev("Q", "emails", "s", 6))
	if got := applied(outs...); len(got) != 0 || seqguard.Count(outs[0].Steps).GapsOpened != 1 {
		t.Fatalf("Q's first event 6 over legacy 3: applied %v, steps %v; want it parked behind the gap 4-5", got, outs[0].Steps)
	}
	// At or below: not adopted (expect-first-seq-1: 1 applies).
	if got := applied(b.deliver(t, pool, at(4), p, sev("R", "orders", "s", 1))...); strings.Join(got, ",") != "1" {
		t.Fatalf("R's first event 1 under legacy 3: applied %v, want 1", got)
	}
	var states []string
	rows, err := pool.Query(context.Background(), `SELECT producer || ':' || topic || ':' || coalesce((`+lastAppliedSQL+`)::text, '-') || ':' || coalesce(first_seq::text, '-')
		FROM onceflow.seq_state s WHERE source = 's' ORDER BY producer, topic`)
	if err != nil {
		t.Fatal(err)
	}
	if states, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if strings.Join(states, " ") != "::3:1 P:orders:5:1 Q:emails:3:1 R:orders:1:1" {
		t.Fatalf("seq_state rows %v", states)
	}
}

// An operator's give-up: the open gaps up to the requested one get their
// deadline moved to the request's time and are given up by the next timer
// run with reason operator, releasing the parked events. A gap split by an
// event that arrives after the request keeps the request in both parts.
// Gaps above the request, and other streams, keep their deadlines.
func TestPGStoreRequestGiveUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	pool := b.db.Pool
	// acct-1: 1 applied, gaps 2-5 and 7-7 and 9-9 open, 6, 8 and 10 parked.
	b.deliver(t, pool, at(0), def, seqs(1, 6, 8, 10)...)
	b.deliver(t, pool, at(0), def, event("acct-2", 2))
	if _, err := b.store.RequestGiveUp(ctx, pool, seqguard.Stream{Source: "acct-1"}, 11, 12, "alice via cli", at(5)); !errors.Is(err, seqguard.ErrGapNotFound) {
		t.Fatalf("give up 11-12 (no gap): %v, want ErrGapNotFound", err)
	}
	if _, err := b.store.RequestGiveUp(ctx, pool, seqguard.Stream{Source: "acct-1"}, 7, 7, "", at(5)); err == nil {
		t.Fatal("give up without a requester: no error")
	}
	var gaps []seqguard.Gap
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		gaps, err = b.store.RequestGiveUp(ctx, tx, seqguard.Stream{Source: "acct-1"}, 7, 7, "alice via cli", at(5))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(gaps); got != "[2-5 7-7]" {
		t.Fatalf("requested gaps %s, want [2-5 7-7] (the one asked for and the one below it)", got)
	}
	// 3 arrives before the timer runs: 2-5 splits into 2-2 and 4-5.
	if outs := b.deliver(t, pool, at(6), def, seqs(3)...); len(applied(outs...)) != 0 {
		t.Fatalf("3 applied: %v, want parked", applied(outs...))
	}
	outs := b.giveUp(t, pool, at(6))
	if got, want := givenUp(outs...), []string{"acct-1 2-2 operator", "acct-1 4-5 operator", "acct-1 7-7 operator"}; !slices.Equal(got, want) {
		t.Fatalf("given up %v, want %v", got, want)
	}
	if got, want := applied(outs...), []string{"3p", "6p", "8p"}; !slices.Equal(got, want) {
		t.Fatalf("released %v, want %v", got, want)
	}
	want := []string{"2-2 given_upoperator opened+0s deadline+5s", "4-5 given_upoperator opened+0s deadline+5s",
		"7-7 given_upoperator opened+0s deadline+5s", "9-9 open opened+0s deadline+30s"}
	if got := gapRows(t, pool, "acct-1"); !slices.Equal(got, want) {
		t.Fatalf("gaps %v, want %v", got, want)
	}
	if got, want := gapRows(t, pool, "acct-2"), []string{"1-1 open opened+0s deadline+30s"}; !slices.Equal(got, want) {
		t.Fatalf("acct-2 gaps %v, want %v (untouched)", got, want)
	}
	recs, err := b.store.ListGaps(ctx, pool, true, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if wantBy := map[bool]string{true: "alice via cli", false: ""}[r.Source == "acct-1" && r.To < 9]; r.GiveUpBy != wantBy {
			t.Errorf("gap %s %d-%d: GiveUpBy %q, want %q", r.Source, r.From, r.To, r.GiveUpBy, wantBy)
		}
	}
}

// A snapshot held for long (an idle-in-transaction session, a report) keeps
// every row version written after it. A stream's state must not cost more
// to lock and move on as its history under such a snapshot grows: after
// 2,000 moves of stream "long" the next event's transaction touches about
// the buffers it touches after 10 moves of stream "short" (when
// last_applied was an UPDATE of the seq_state row, each lock walked every
// version kept since the snapshot). The buffers are the transaction's own
// counts (pg_stat_get_xact_blocks_*), so the machine's load does not move
// them.
func TestPGStoreHeldSnapshotCostFlat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	pool := b.db.Pool
	defer testkit.HoldSnapshot(t, b.db.URL)()
	move := func(src string, from, to int64) {
		for seq := from; seq <= to; seq++ {
			b.deliver(t, pool, at(0), def, event(src, seq))
		}
	}
	// blocks delivers src's next seq and returns the buffers its
	// transaction read from the onceflow tables and their indexes.
	blocks := func(src string, seq int64) int64 {
		t.Helper()
		var n int64
		// A connection of its own: a backend's counts include what it has
		// not reported yet, so a pooled one would add earlier work.
		conn, err := pgx.Connect(ctx, b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			ev := event(src, seq)
			if _, err := tx.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'processed', now())`, consumer, ev.EventID, ev.Source, ev.Seq, ev.EventType, ev.Topic, ev.Partition, ev.Offset); err != nil {
				return err
			}
			l, err := b.store.Lock(ctx, tx, []seqguard.Stream{ev.Stream()}, at(0))
			if err != nil {
				return err
			}
			if out, err := l.Receive(ctx, ev, at(0), def); err != nil || len(out.Apply) != 1 {
				return fmt.Errorf("receive %d: %v %+v", seq, err, out)
			}
			return tx.QueryRow(ctx, `
SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) FROM pg_class c
WHERE c.relnamespace = 'onceflow'::regnamespace AND c.relname IN
    ('seq_state', 'seq_state_pkey', 'seq_applied', 'seq_applied_pkey', 'seq_gaps')`).Scan(&n)
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	move("short", 1, 10)
	short := blocks("short", 11)
	move("long", 1, 2000)
	// What autovacuum does at some point in production: statistics that
	// count the live rows (one per stream) and not the entries the snapshot
	// keeps. The planner then expects one row from any scan of a stream's
	// range and may choose a bitmap scan of all of it (qWalkPlans).
	if _, err := pool.Exec(ctx, `ANALYZE onceflow.seq_applied, onceflow.seq_state`); err != nil {
		t.Fatal(err)
	}
	long := blocks("long", 2001)
	t.Logf("buffers read by one event's transaction: %d after 10 moves, %d after 2000 (a snapshot held throughout)", short, long)
	if long > 2*short+10 {
		t.Fatalf("one event's transaction read %d buffers after 2000 moves under a held snapshot, %d after 10: the cost grows with the history", long, short)
	}
}

// TestPGStoreDeferWrites: with DeferWrites the same deliveries (events of
// two sources shuffled within windows of six, so that most are parked
// behind a gap and released later, with gaps given up by the timer between
// batches) leave the database exactly as without it, and with
// DeferInOrder on as well (the consumer's setting). Inside a transaction a
// park is not sent until a read or Flush; Reload drops what was queued; a
// queued write that fails is reported by Flush, naming the event.
func TestPGStoreDeferWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := seqguard.Policy{GapTimeout: 30 * time.Second}
	// The deliveries: seqs 1..60 of a and b, shuffled within windows of
	// six (a fixed permutation), seq 13 of a never sent (its gap is given
	// up), five events per transaction.
	perm := []int{3, 0, 5, 1, 4, 2}
	var evs []seqguard.Event
	for w := int64(0); w < 10; w++ {
		for _, i := range perm {
			for _, src := range []string{"a", "b"} {
				seq := w*6 + int64(i) + 1
				if src == "a" && seq == 13 {
					continue
				}
				evs = append(evs, event(src, seq))
			}
		}
	}
	dump := func(b *bundle) string {
		t.Helper()
		var out string
		for _, q := range []string{
			`SELECT source || ' ' || coalesce((` + lastAppliedSQL + `)::text, '-') FROM onceflow.seq_state s WHERE consumer = $1 ORDER BY source`,
			`SELECT source || ' ' || from_seq || '-' || to_seq || ' ' || state FROM onceflow.seq_gaps WHERE consumer = $1 ORDER BY source, from_seq`,
			`SELECT event_id || ' ' || status || ' ' || late || ' ' || (payload IS NULL) FROM onceflow.inbox WHERE consumer = $1 ORDER BY event_id`,
		} {
			rows, err := b.db.Pool.Query(ctx, q, consumer)
			if err != nil {
				t.Fatal(err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			out += strings.Join(lines, "\n") + "\n--\n"
		}
		return out
	}
	run := func(inOrder, writes bool) (string, []int64) {
		b := setup(t)
		b.store.DeferInOrder, b.store.DeferWrites = inOrder, writes
		var applied []int64
		for i := 0; i < len(evs); i += 5 {
			now := at(i) // five seconds a batch: a gap lives some 2 batches, a-13's is given up
			for _, out := range b.deliver(t, b.db.Pool, now, p, evs[i:min(i+5, len(evs))]...) {
				for _, a := range out.Apply {
					if a.Event.Source == "a" {
						applied = append(applied, a.Event.Seq)
					}
				}
			}
			if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				outs, err := b.store.GiveUpExpired(ctx, tx, now, 10)
				for _, out := range outs {
					for _, a := range out.Apply {
						if a.Event.Source == "a" {
							applied = append(applied, a.Event.Seq)
						}
					}
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		return dump(b), applied
	}
	want, wantApplied := run(false, false)
	if !strings.Contains(want, "a 13-13 given_up") {
		t.Fatalf("the reference run gave no gap up:\n%s", want)
	}
	for _, c := range []struct{ inOrder, writes bool }{{false, true}, {true, true}} {
		got, applied := run(c.inOrder, c.writes)
		if got != want {
			t.Errorf("DeferInOrder %t, DeferWrites %t: the database differs\ngot:\n%s\nwant:\n%s", c.inOrder, c.writes, got, want)
		}
		if !slices.Equal(applied, wantApplied) {
			t.Errorf("DeferInOrder %t, DeferWrites %t: a's handler runs %v, want %v", c.inOrder, c.writes, applied, wantApplied)
		}
	}

	// Inside one transaction.
	b := setup(t)
	b.store.DeferWrites = true
	status := func(q seqguard.Querier, id string) string {
		t.Helper()
		var s string
		if err := q.QueryRow(ctx, `SELECT status FROM onceflow.inbox WHERE consumer = $1 AND event_id = $2`, consumer, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	insert := func(tx pgx.Tx, evs ...seqguard.Event) {
		t.Helper()
		for _, ev := range evs {
			if _, err := tx.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'processed', now())`, consumer, ev.EventID, ev.Source, ev.Seq, ev.EventType, ev.Topic, ev.Partition, ev.Offset); err != nil {
				t.Fatal(err)
			}
		}
	}
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		insert(tx, event("c", 2), event("c", 1))
		l, err := b.store.Lock(ctx, tx, legacy("c"), at(0))
		if err != nil {
			return err
		}
		if _, err := l.Receive(ctx, event("c", 2), at(0), p); err != nil {
			return err
		}
		if s := status(tx, "c-2"); s != "processed" {
			t.Errorf("c-2 is %s before a read or Flush, want its park queued", s)
		}
		out, err := l.Receive(ctx, event("c", 1), at(0), p)
		if err != nil {
			return err
		}
		if len(out.Apply) != 2 || string(out.Apply[1].Event.Payload) != "payload 2" {
			t.Errorf("c-1's outcome %+v: want c-1, then c-2 read back with its payload", out.Apply)
		}
		if s := status(tx, "c-2"); s != "processed" {
			t.Errorf("c-2 is %s after its release", s)
		}
		// Queued, then dropped by Reload: c-4 is never parked.
		insert(tx, event("c", 4))
		if _, err := l.Receive(ctx, event("c", 4), at(0), p); err != nil {
			return err
		}
		if err := l.Reload(ctx); err != nil {
			return err
		}
		if err := l.Flush(ctx); err != nil {
			return err
		}
		if s := status(tx, "c-4"); s != "processed" {
			t.Errorf("c-4 is %s: a write queued before Reload was sent", s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A park whose inbox row is missing: Receive queues it, Flush fails.
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		l, err := b.store.Lock(ctx, tx, legacy("d"), at(0))
		if err != nil {
			return err
		}
		if _, err := l.Receive(ctx, event("d", 2), at(0), p); err != nil {
			t.Errorf("Receive of a park: %v; want it queued", err)
		}
		return l.Flush(ctx)
	})
	if err == nil || !strings.Contains(err.Error(), "d-2") {
		t.Fatalf("Flush of a park without its inbox row: %v; want an error naming d-2", err)
	}
}
