package itest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestRelayUnqueuedRows: rows inserted while the outbox's ordinary triggers
// do not fire never enter onceflow.outbox_pending; the relay must still
// publish every one, in seq order per source, and count them in
// onceflow_relay_unqueued_rows_found_total. Three ways:
//   - "old": 10 rows written under session_replication_role = replica
//     before the relay starts, buried under 2,000 newer rows (the full walk
//     finds them);
//   - "rep": a running relay; 5 rows under session_replication_role =
//     replica (logical replication's apply, pg_restore --disable-triggers),
//     then 5 more of the same source by an ordinary session, which are
//     queued at once and must not overtake the first 5;
//   - "dis": the same with ALTER TABLE onceflow.outbox DISABLE TRIGGER ALL.
func TestRelayUnqueuedRows(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 2)
	// enqueue commits n events of source, seqs from on. With setup (the
	// triggers off) the rows are written whole, seq included, and the
	// stream's counter moved, as logical replication's apply or a restore
	// writes them; without, through onceflow.enqueue.
	enqueue := func(source string, from, n int, setup, teardown string) time.Time {
		t.Helper()
		err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			if setup == "" {
				_, err := tx.Exec(ctx, `SELECT onceflow.enqueue($1, $2, 'test.event', '{}'::jsonb, $2 || '-' || i) FROM generate_series($3::int, $3::int + $4::int - 1) AS i`,
					e.topic, source, from, n)
				return err
			}
			if _, err := tx.Exec(ctx, setup); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `
				INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload)
				SELECT $2 || '-' || i, $1, $2, i, 'test.event', '{}'::bytea FROM generate_series($3::int, $3::int + $4::int - 1) AS i`,
				e.topic, source, from, n); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `
				INSERT INTO onceflow.source_seq (source, topic, last_seq) VALUES ($2, $1, $3::int + $4::int - 1)
				ON CONFLICT (source, topic) DO UPDATE SET last_seq = excluded.last_seq`, e.topic, source, from, n); err != nil {
				return err
			}
			if teardown != "" {
				_, err := tx.Exec(ctx, teardown)
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatalf("enqueue %s: %v", source, err)
		}
		return time.Now()
	}
	const replica, origin = "SET LOCAL session_replication_role = replica", ""
	enqueue("old", 1, 10, replica, origin)
	for i := range 20 {
		enqueue(fmt.Sprintf("bulk-%d", i), 1, 100, origin, origin)
	}
	relay := e.start("relay", nil, "-holder-id", "r")
	line, err := relay.WaitFor(ctx, reHTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + reHTTPAddr.FindStringSubmatch(line)[1]
	waitSeqs := func(source string, n int) time.Time {
		t.Helper()
		for {
			got := publishedPerSource(t, ctx, e.topic)[source]
			if len(got) >= n {
				want := make([]int64, n)
				for i := range want {
					want[i] = int64(i + 1)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("source %s on the topic: seqs %v, want 1…%d once each, in order", source, got, n)
				}
				return time.Now()
			}
			if ctx.Err() != nil {
				t.Fatalf("source %s: %d of %d events on the topic before the deadline; relay output:\n%s", source, len(got), n, relay.Output())
			}
			time.Sleep(50 * time.Millisecond) // polling a condition
		}
	}
	t0 := time.Now()
	tOld := waitSeqs("old", 10).Sub(t0)
	waitSeqs("bulk-19", 100)

	t1 := enqueue("rep", 1, 5, replica, origin)
	enqueue("rep", 6, 5, origin, origin)
	tRep := waitSeqs("rep", 10).Sub(t1)

	t2 := enqueue("dis", 1, 5, "ALTER TABLE onceflow.outbox DISABLE TRIGGER ALL", "ALTER TABLE onceflow.outbox ENABLE TRIGGER ALL")
	enqueue("dis", 6, 5, origin, origin)
	tDis := waitSeqs("dis", 10).Sub(t2)

	var found float64
	for found = metricsOf(t, ctx, base)["onceflow_relay_unqueued_rows_found_total"]; found != 20; found = metricsOf(t, ctx, base)["onceflow_relay_unqueued_rows_found_total"] {
		if ctx.Err() != nil {
			t.Fatalf("onceflow_relay_unqueued_rows_found_total = %v, want 20 (the 10 old rows were found by the relay... or before)", found)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition
	}
	rep := e.check(ctx)
	if rep.Committed != 2030 || rep.Seen != 2030 {
		t.Fatalf("%d events, %d records; want 2030 of each", rep.Committed, rep.Seen)
	}
	t.Logf("unqueued rows published: old 10/10 (%s after start, under 2,000 newer rows), rep 10/10 in order (%s after commit), dis 10/10 in order (%s); metric %v",
		tOld.Round(time.Millisecond), tRep.Round(time.Millisecond), tDis.Round(time.Millisecond), found)
}
