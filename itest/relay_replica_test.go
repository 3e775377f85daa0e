package itest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestRelayOnALogicalReplicaRestarts: the producing database's outbox is
// fed by logical replication from another database (a publication there, a
// subscription here). The apply worker writes each row with the id, seq and
// event id it had at the source, with session_replication_role = replica:
// the triggers do not fire (the relay's sweep queues the rows) and this
// database's outbox id sequence never moves (logical replication does not
// carry sequences). The relay publishes the rows and, restarted, must go on:
// before, its recovery compared the checkpoint's ids with the sequence
// alone, found ids "above what the sequence has handed out" and stopped as
// if the database had been restored to an earlier point.
func TestRelayOnALogicalReplicaRestarts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := newRelayEnv(t, 1)
	// As the apply worker writes them: ids and seqs from the source.
	replicate := func(from, to int) {
		t.Helper()
		err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO onceflow.outbox (id, event_id, topic, source, seq, event_type, payload)
				OVERRIDING SYSTEM VALUE
				SELECT 1000 + g, 'replicated-' || g, $1, 's', g, 'test.event', '{}'::bytea FROM generate_series($2::int, $3::int) g`,
				e.topic, from, to)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	published := func(n int) {
		t.Helper()
		for {
			var got int
			if err := e.db.Pool.QueryRow(ctx, `SELECT coalesce(sum(cardinality(ids)), 0) FROM onceflow.outbox_published`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got >= n {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("%d of %d replicated rows published", got, n)
			}
			time.Sleep(50 * time.Millisecond) // polling the publish log
		}
	}
	replicate(1, 30)
	var last *int64
	if err := e.db.Pool.QueryRow(ctx, `SELECT pg_sequence_last_value(pg_get_serial_sequence('onceflow.outbox', 'id')::regclass)`).Scan(&last); err != nil || last != nil {
		t.Fatalf("the outbox sequence moved (%v, %v): the test does not write as the apply worker does", last, err)
	}
	p := e.start("relay", nil, "-holder-id", "r")
	published(30)
	p.Kill()
	<-p.Done()

	replicate(31, 40)
	p2 := e.start("relay-restarted", nil, "-holder-id", "r")
	if _, err := p2.WaitFor(ctx, reReady); err != nil {
		t.Fatalf("the restarted relay did not recover: %v; output:\n%s", err, p2.Output())
	}
	published(40)
	p2.Kill()
	<-p2.Done()
	if out := p2.Output(); strings.Contains(out, "restored to an earlier point") {
		t.Fatalf("the relay took the replica for a restored database; output:\n%s", out)
	}
	// A quiet subscriber: retention prunes every old batch but the one
	// holding the highest id published (migration 031), and the next start
	// still recovers (before: the table and the log were empty, and it
	// stopped as if the database had been restored).
	// until polls q (one number) until done accepts it.
	until := func(what string, p interface{ Output() string }, q string, done func(int64) bool) int64 {
		t.Helper()
		for {
			var n int64
			if err := e.db.Pool.QueryRow(ctx, q).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if done(n) {
				return n
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: still %d; output:\n%s", what, n, p.Output())
			}
			time.Sleep(50 * time.Millisecond) // polling the publish log
		}
	}
	p3 := e.start("relay-pruning", nil, "-holder-id", "r", "-retention", "-1s", "-prune-interval", "50ms")
	batches := until("publish-log batches, want the newest alone", p3, `SELECT count(*) FROM onceflow.outbox_published`,
		func(n int64) bool { return n <= 1 })
	t.Logf("pruned down to %d batch", batches)
	p3.Kill()
	<-p3.Done()
	p4 := e.start("relay-after-pruning", nil, "-holder-id", "r")
	if _, err := p4.WaitFor(ctx, reReady); err != nil {
		t.Fatalf("the relay restarted after pruning did not recover: %v; output:\n%s", err, p4.Output())
	}
	replicate(41, 45)
	until("the rows replicated after pruning published: publish log up to id", p4, `SELECT coalesce(max(last_id), 0) FROM onceflow.outbox_published`,
		func(n int64) bool { return n >= 1045 })
	p4.Kill()
	<-p4.Done()
	perSource := publishedPerSource(t, ctx, e.topic)
	if n := len(perSource["s"]); n != 45 {
		t.Fatalf("%d records of s on the topic, want 45", n)
	}
	t.Logf("%d replicated rows published across three restarts, one after pruning; the outbox sequence never moved", 45)
}
