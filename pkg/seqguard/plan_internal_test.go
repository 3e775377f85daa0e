package seqguard

import (
	"context"
	"fmt"
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
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var plans []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(n.Message, "LockRows") {
			plans = append(plans, n.Message)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`LOAD 'auto_explain'`, // needs a superuser and the contrib module, as the test database has
		`SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_level = notice`,
		`SET auto_explain.log_verbose = on`, // shows the unnest's arguments
		`SET plan_cache_mode = force_generic_plan`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v (the test reads plans through auto_explain)", q, err)
		}
	}
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
	mu.Lock()
	defer mu.Unlock()
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

// TestParkReadsOnlyTheRowsBucket: parking an event whose inbox row this
// transaction inserted (Event.Lane set) sets up the scan of that row's
// time bucket only, not of every bucket of its lane, under a generic plan
// too (the plan the statement cache settles on). Read from auto_explain's
// plans of the executed statement, which list the subplans set up.
func TestParkReadsOnlyTheRowsBucket(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	const lane = "ttl-3600s"
	for k := range 6 {
		if _, err := db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets('c', $1, now() - $2 * interval '1 hour')`, lane, k); err != nil {
			t.Fatal(err)
		}
	}
	var buckets int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.inbox_buckets WHERE consumer = 'c' AND lane = $1`, lane).Scan(&buckets); err != nil || buckets < 6 {
		t.Fatalf("%d buckets (%v), want at least 6", buckets, err)
	}
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var plans []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(n.Message, "Update on inbox") {
			plans = append(plans, n.Message)
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`LOAD 'auto_explain'`,
		`SET auto_explain.log_min_duration = 0`,
		`SET auto_explain.log_level = notice`,
		`SET auto_explain.log_analyze = on`, // lists the subplans run, and how many were pruned
		`SET plan_cache_mode = force_generic_plan`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v (the test reads plans through auto_explain)", q, err)
		}
	}
	store := &PGStore{Consumer: "c"}
	const runs = 3
	for i := range runs {
		ev := Event{EventID: fmt.Sprintf("ev-%d", i), Source: fmt.Sprintf("src-%d", i), Seq: 2, EventType: "t", Topic: "orders", Lane: lane}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, lane)
				VALUES ('c', $1, $2, 2, 't', 'orders', 0, $3, 'processed', now(), $4)`, ev.EventID, ev.Source, i, lane); err != nil {
				return err
			}
			l, err := store.Lock(ctx, tx, []Stream{ev.Stream()}, time.Now())
			if err != nil {
				return err
			}
			out, err := l.Receive(ctx, ev, time.Now(), Policy{MaxParked: 10})
			if err != nil {
				return err
			}
			if len(out.Apply) != 0 {
				return fmt.Errorf("seq 2 of a new stream applied: %+v", out.Apply)
			}
			return l.Flush(ctx)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(plans) != runs {
		t.Fatalf("%d plans of the park, want %d:\n%s", len(plans), runs, strings.Join(plans, "\n"))
	}
	for _, p := range plans {
		n := 0
		for _, line := range strings.Split(p, "\n") {
			if strings.Contains(line, "Scan") && strings.Contains(line, " on inbox_") {
				n++
			}
		}
		if n != 1 || !strings.Contains(p, "Subplans Removed") {
			t.Errorf("the park scanned %d buckets, want the row's one (the others pruned):\n%s", n, p)
		}
	}
}
