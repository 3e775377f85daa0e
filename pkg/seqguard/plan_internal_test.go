package seqguard

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/testkit"
)

// The seq_state lock (of legacy streams and producers' streams alike) runs with a custom plan, in Lock's round trip and in
// Reload, even in a session that forces generic plans, and the session's
// plan mode is back right after it. A generic plan of the lock searches the
// batch's sources linearly for every row of a small table, or keeps a plan
// made while the table was nearly empty (see qCustomPlans). The plans are
// read from auto_explain, which the test loads into its session and asks to
// send every plan to the client as a NOTICE.
func TestLockStateRunsWithACustomPlan(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO onceflow.seq_state (consumer, source, producer, topic, last_applied)
		SELECT 'c', 'src-' || g, p, t, 1 FROM generate_series(1, 1000) g,
		    (VALUES ('', ''), ('db-1', 'orders')) AS k(p, t)`); err != nil {
		t.Fatal(err)
	}
	conn, lockPlans := explainConn(t, db.URL, "LockRows",
		`SET auto_explain.log_verbose = on`, // shows the unnest's arguments
		`SET plan_cache_mode = force_generic_plan`)
	srcs := make([]Stream, 250)
	for i := range srcs {
		srcs[i] = Stream{Source: fmt.Sprintf("src-%d", 4*i+1)}
		if i%2 == 1 {
			srcs[i].Producer, srcs[i].Topic = "db-1", "orders"
		}
	}
	store := &PGStore{Consumer: "c"}
	const runs = 7 // more than the five custom plans PostgreSQL makes before it may go generic
	for range runs {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = func() error {
			l, err := store.Lock(ctx, tx, srcs, time.Now())
			if err != nil {
				return err
			}
			if len(l.states) != len(srcs) {
				return fmt.Errorf("locked %d sources, want %d", len(l.states), len(srcs))
			}
			if err := l.Reload(ctx); err != nil {
				return err
			}
			var mode string
			if err := tx.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&mode); err != nil {
				return err
			}
			if mode != "force_generic_plan" {
				return fmt.Errorf("plan_cache_mode is %q after the lock, want the session's force_generic_plan", mode)
			}
			var sorts, seqscans string
			if err := tx.QueryRow(ctx, `SELECT current_setting('enable_sort'), current_setting('enable_seqscan')`).Scan(&sorts, &seqscans); err != nil {
				return err
			}
			if sorts != "on" || seqscans != "on" {
				return fmt.Errorf("enable_sort %s, enable_seqscan %s after the lock, want the session's on", sorts, seqscans)
			}
			return nil
		}()
		if rerr := tx.Rollback(ctx); err == nil {
			err = rerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	plans := lockPlans()
	if len(plans) != 2*runs {
		t.Fatalf("%d plans of the lock (Lock and Reload), want %d", len(plans), 2*runs)
	}
	for _, p := range plans {
		// A generic plan unnests the parameters $2, $3, $4 (its row count
		// a guess); a custom one the constant arrays.
		if !strings.Contains(p, "Function Call: unnest('{") || strings.Contains(p, "Function Call: unnest($") {
			t.Fatalf("the lock did not run a custom plan (the streams as constants):\n%s", p)
		}
	}
}

// TestStreamStatementsReadOnlyTheirStreams: the statements of a batch's
// streams (the lock, the read of their state and the flush's move of
// their seq_applied entries) find each stream's rows by key, however stale
// the tables' statistics and whatever the plan mode. Joined to the batch's
// streams as a table, they were planned, with statistics taken while the
// tables were nearly empty (a fresh consumer's drain), as hash joins over
// every row of the consumer, custom plans too: each batch read all of
// seq_state twice and all of seq_applied once (8,139 index entries to
// delete 234 in the consumer drain; session 14). No statement may read
// more rows than twice the streams it is given.
func TestStreamStatementsReadOnlyTheirStreams(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	const streams, batch = 20_000, 250
	for _, q := range []string{
		`ANALYZE onceflow.seq_state`,
		`ANALYZE onceflow.seq_applied`,
		fmt.Sprintf(`INSERT INTO onceflow.seq_state (consumer, source, producer, topic, last_applied)
		 SELECT 'c', 'src-' || g, '', '', 5 FROM generate_series(1, %d) g`, streams),
		fmt.Sprintf(`INSERT INTO onceflow.seq_applied (consumer, source, producer, topic, last_applied)
		 SELECT 'c', 'src-' || g, '', '', 10 FROM generate_series(1, %d) g`, streams),
		// Every stream with two filled gaps, counted while no gap was
		// open, then an open one.
		fmt.Sprintf(`INSERT INTO onceflow.seq_gaps (consumer, source, producer, topic, from_seq, to_seq, opened_at, deadline, state, closed_at)
		 SELECT 'c', 'src-' || g, '', '', f, f, now(), now() + interval '1 hour', 'filled', now()
		   FROM generate_series(1, %d) g, (VALUES (3), (6)) AS v(f)`, streams),
		`ANALYZE onceflow.seq_gaps`,
		fmt.Sprintf(`INSERT INTO onceflow.seq_gaps (consumer, source, producer, topic, from_seq, to_seq, opened_at, deadline)
		 SELECT 'c', 'src-' || g, '', '', 9, 9, now(), now() + interval '1 hour' FROM generate_series(1, %d) g`, streams),
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	srcs, prods, topics := make([]string, batch), make([]string, batch), make([]string, batch)
	lasts, prevs := make([]int64, batch), make([]int64, batch)
	for i := range srcs {
		srcs[i], lasts[i], prevs[i] = fmt.Sprintf("src-%d", 7*i+1), 11, 10
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
		for _, c := range []struct {
			name, q    string
			args       []any
			walk, gaps bool
		}{
			{"lock (qLockState)", qLockState, []any{"c", srcs, prods, topics}, false, false},
			{"read (qReadState)", qReadState, []any{"c", srcs, prods, topics}, true, false},
			{"flush (qAppendApplieds)", qAppendApplieds, []any{"c", srcs, prods, topics, lasts, prevs}, false, false},
			{"gaps (qLoadGaps)", qLoadGaps, []any{"c", srcs, prods, topics}, true, true},
		} {
			set := "SET plan_cache_mode = " + mode
			if c.walk { // as Lock runs it (qWalkPlans)
				set += "; SET enable_bitmapscan = off; SET enable_seqscan = off"
			} else {
				set += "; RESET enable_bitmapscan; RESET enable_seqscan"
			}
			if c.gaps { // and qGapPlans
				set += "; SET enable_sort = off"
			} else {
				set += "; RESET enable_sort"
			}
			if _, err := conn.Exec(ctx, set); err != nil {
				t.Fatal(err)
			}
			if read := testkit.RowsRead(t, conn, "seq_", c.q, c.args...); read > 2*batch {
				t.Errorf("%s, %s: %v rows read for %d of %d streams", c.name, mode, read, batch, streams)
			}
		}
	}
	if _, err := conn.Exec(ctx, "RESET ALL"); err != nil {
		t.Fatal(err)
	}
}

// TestInLane: the park and mark-late statements, bounded to a lane, name
// the lane and the consumer as escaped constants (pruned whatever the
// plan); without a lane they are unchanged; a statement of another shape
// is refused.
func TestInLane(t *testing.T) {
	t.Parallel()
	for _, q := range []string{qPark, qMarkLate} {
		if got := inLane(q, "c", ""); got != q {
			t.Errorf("no lane: %q, want the statement unchanged", got)
		}
		got := inLane(q, `it's\c`, "ttl-60s")
		want := `WHERE lane = E'ttl-60s' AND consumer = E'it''s\\c' AND event_at = now() AND consumer = $1 AND event_id = $2`
		if !strings.HasSuffix(got, want) || strings.Count(got, "WHERE") != 1 {
			t.Errorf("%q\nwant it to end in %q", got, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("inLane of qUnpark did not panic")
		}
	}()
	inLane(qUnpark, "c", "ttl-60s")
}

// explainConn connects to url with auto_explain loaded into the session,
// every plan of a statement sent to the client as a NOTICE after the
// settings given; plans returns those whose text contains match.
func explainConn(t *testing.T, url, match string, settings ...string) (conn *pgx.Conn, plans func() []string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(n.Message, match) {
			got = append(got, n.Message)
		}
	}
	conn, err = pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, q := range append([]string{
		`LOAD 'auto_explain'`, // needs a superuser and the contrib module, as the test database has
		`SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_level = notice`,
	}, settings...) {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v (the test reads plans through auto_explain)", q, err)
		}
	}
	return conn, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// laneBuckets makes six hourly buckets of lane for consumer c, back from now.
func laneBuckets(t *testing.T, db *testkit.DB, lane string) {
	t.Helper()
	for k := range 6 {
		if _, err := db.Pool.Exec(context.Background(), `SELECT onceflow.inbox_ensure_buckets('c', $1, now() - $2 * interval '1 hour')`, lane, k); err != nil {
			t.Fatal(err)
		}
	}
}

// deliverInLane does what the consumer does for a batch of consumer c in
// one transaction on conn: it inserts the events' inbox rows into lane,
// locks their streams reading the lane (LockIn) and runs the guard for
// each event; it returns the ids of the events applied, in order.
func deliverInLane(t *testing.T, conn *pgx.Conn, lane string, evs ...Event) []string {
	t.Helper()
	ctx := context.Background()
	store := &PGStore{Consumer: "c"}
	var applied []string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		streams := make([]Stream, len(evs))
		for i, ev := range evs {
			if _, err := tx.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, lane)
				VALUES ('c', $1, $2, $3, 't', 'orders', 0, $3, 'processed', now(), $4)`, ev.EventID, ev.Source, ev.Seq, lane); err != nil {
				return err
			}
			streams[i] = ev.Stream()
		}
		// The consumer's lanes, as the inbox passes them: the lane is the
		// partition key's first column, so without it event_at prunes nothing.
		l, err := store.LockIn(ctx, tx, streams, time.Now(), []string{lane})
		if err != nil {
			return err
		}
		for _, ev := range evs {
			out, err := l.Receive(ctx, ev, time.Now(), Policy{MaxParked: 10})
			if err != nil {
				return err
			}
			for _, a := range out.Apply {
				applied = append(applied, a.Event.EventID)
			}
		}
		return l.Flush(ctx)
	})
	if err != nil {
		t.Fatalf("deliver %d events: %v", len(evs), err)
	}
	return applied
}

// laneEvent is seq of source src in lane, its id "src-seq".
func laneEvent(src string, seq int64, lane string) Event {
	return Event{EventID: fmt.Sprintf("%s-%d", src, seq), Source: src, Seq: seq, EventType: "t", Topic: "orders", Lane: lane}
}

// TestParkAndUnparkReadOnlyTheRowsBuckets: parking an event whose inbox
// row this transaction inserted (Event.Lane set) sets up the scan of that
// row's time bucket only, not of every bucket of its lane, under a generic
// plan too (the plan the statement cache settles on); un-parking it in a
// later transaction, after its row moved to an older bucket, reads and
// updates that bucket only (the parked rows' event_at read with the lock);
// a row parked in an older bucket and one parked by the releasing
// transaction are released together. Read from auto_explain's plans of the
// executed statements, which list the subplans set up.
func TestParkAndUnparkReadOnlyTheRowsBuckets(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	const lane = "ttl-3600s"
	laneBuckets(t, db, lane)
	conn, plans := explainConn(t, db.URL, "Update on inbox",
		`SET auto_explain.log_analyze = on`, // lists the subplans run, and how many were pruned
		`SET plan_cache_mode = force_generic_plan`)
	const runs = 3
	for i := range runs {
		if got := deliverInLane(t, conn, lane, laneEvent(fmt.Sprint("src-", i), 2, lane)); len(got) != 0 {
			t.Fatalf("seq 2 of a new stream applied: %v", got)
		}
	}
	// src-0's parked seq 2 moves three hours back, to another bucket; seq
	// 1 then releases it.
	older := func(id string) string {
		var name string
		if err := db.Pool.QueryRow(ctx, `UPDATE onceflow.inbox SET event_at = now() - interval '3 hours' WHERE consumer = 'c' AND event_id = $1
			RETURNING tableoid::regclass::text`, id).Scan(&name); err != nil {
			t.Fatal(err)
		}
		return strings.TrimPrefix(name, "onceflow.")
	}
	old := older("src-0-2")
	if got := deliverInLane(t, conn, lane, laneEvent("src-0", 1, lane)); strings.Join(got, ",") != "src-0-1,src-0-2" {
		t.Fatalf("applied %v, want src-0-1 then the released src-0-2", got)
	}
	// src-1: seq 2 parked in an older bucket, seq 3 parked by this
	// transaction (its time is the transaction's), both released by seq 1:
	// the un-park's bounds cover both.
	older("src-1-2")
	if got := deliverInLane(t, conn, lane, laneEvent("src-1", 3, lane), laneEvent("src-1", 1, lane)); strings.Join(got, ",") != "src-1-1,src-1-2,src-1-3" {
		t.Fatalf("applied %v, want src-1-1 then the released src-1-2 and src-1-3", got)
	}
	scans := func(p string) (on []string) {
		for _, line := range strings.Split(p, "\n") {
			if i := strings.Index(line, " on inbox_"); i >= 0 && strings.Contains(line, "Scan") {
				on = append(on, strings.Fields(line[i+4:])[0])
			}
		}
		return on
	}
	var parks, unparks []string
	for _, p := range plans() {
		if strings.Contains(p, "old0") {
			unparks = append(unparks, p)
		} else {
			parks = append(parks, p)
		}
	}
	if len(parks) != runs+1 || len(unparks) != 2 {
		t.Fatalf("%d plans of the park, %d of the un-park, want %d and 2:\n%s", len(parks), len(unparks), runs+1, strings.Join(plans(), "\n"))
	}
	for _, p := range parks {
		if on := scans(p); len(on) != 1 || !strings.Contains(p, "Subplans Removed") {
			t.Errorf("the park scanned %v, want the row's bucket only (the others pruned):\n%s", on, p)
		}
	}
	if on := scans(unparks[0]); len(on) != 2 || on[0] != old || on[1] != old {
		t.Errorf("the un-park scanned %v, want its read and its update in %s only:\n%s", on, old, unparks[0])
	}
}

// TestUnparkSettlesOnAGenericPlan: the un-park's time bounds are written so
// that the planner cannot prune by them (a parameter plus an interval is
// not a constant to it), only the executor when the statement starts. As
// plain parameters, every custom plan pruned to one bucket and looked so
// much cheaper than the generic plan that PostgreSQL planned the statement
// anew on every execution (the swapped-pairs drain ran at 2,960 events/s
// instead of 6,100). Read from pg_prepared_statements after ten un-parks
// in the default plan mode.
func TestUnparkSettlesOnAGenericPlan(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	const lane = "ttl-3600s"
	laneBuckets(t, db, lane)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const runs = 10
	for i := range runs {
		src := fmt.Sprint("src-", i)
		deliverInLane(t, conn, lane, laneEvent(src, 2, lane))
		if got := deliverInLane(t, conn, lane, laneEvent(src, 1, lane)); len(got) != 2 {
			t.Fatalf("%s: seq 1 applied %v, want it and the released seq 2", src, got)
		}
	}
	var custom, generic int64
	if err := conn.QueryRow(ctx, `SELECT coalesce(sum(custom_plans), 0), coalesce(sum(generic_plans), 0) FROM pg_prepared_statements WHERE statement LIKE '%old0%'`).Scan(&custom, &generic); err != nil {
		t.Fatal(err)
	}
	if custom > 5 || generic < runs-5 {
		t.Errorf("the un-park ran %d times with %d custom and %d generic plans, want at most the 5 custom ones PostgreSQL tries first", runs, custom, generic)
	}
}
