package itest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	deploysql "github.com/onceflow/onceflow/deploy/sql"
)

// TestRelaySubscriberQueueTrigger: a producing database fed by logical
// replication, set up with deploy/sql/subscriber.sql. Rows written as the
// apply worker writes them (session_replication_role = replica, the
// source's ids and seqs) are queued by the file's trigger in their own
// transaction, so the sweep finds none (without the trigger it finds all
// 3,002: the test fails on the counter), and a late committer, a source
// transaction whose first row drew an id 3,900 below the highest the relay
// has seen, is published in order.
func TestRelaySubscriberQueueTrigger(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := newRelayEnv(t, 1)
	if _, err := e.db.Pool.Exec(ctx, deploysql.Subscriber); err != nil {
		t.Fatalf("deploy/sql/subscriber.sql: %v", err)
	}
	// As the apply worker writes a source transaction's rows.
	apply := func(rows [][3]any) {
		t.Helper()
		err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				return err
			}
			for _, r := range rows {
				if _, err := tx.Exec(ctx, `INSERT INTO onceflow.outbox (id, event_id, topic, source, seq, event_type, payload)
					OVERRIDING SYSTEM VALUE VALUES ($1::bigint, $2::text || '-' || $3::bigint, $4, $2::text, $3::bigint, 'test.event', '{}'::bytea)`,
					r[0], r[1], r[2], e.topic); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	waitSeqs := func(source string, n int) []int64 {
		t.Helper()
		for {
			got := publishedPerSource(t, ctx, e.topic)[source]
			if len(got) >= n || ctx.Err() != nil {
				return got
			}
			time.Sleep(50 * time.Millisecond) // polling a condition
		}
	}
	// 3,000 rows of another source (one source transaction), published
	// first: the relay has seen ids up to 4,000.
	var bulk [][3]any
	for i := range 3000 {
		bulk = append(bulk, [3]any{int64(1001 + i), "bulk", int64(i + 1)})
	}
	apply(bulk)
	relay := e.start("relay", nil, "-holder-id", "r")
	line, err := relay.WaitFor(ctx, reHTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + reHTTPAddr.FindStringSubmatch(line)[1]
	if got := waitSeqs("bulk", 3000); len(got) != 3000 {
		t.Fatalf("%d of 3000 bulk rows published; relay output:\n%s", len(got), relay.Output())
	}
	// The late committer: seq 1 of source late drew id 100 long ago, seq 2
	// id 5000; one source transaction, applied as one.
	apply([][3]any{{int64(100), "late", int64(1)}, {int64(5000), "late", int64(2)}})
	got := waitSeqs("late", 2)
	if !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("source late on the topic: seqs %v, want [1 2]; relay output:\n%s", got, relay.Output())
	}
	if found := metricsOf(t, ctx, base)["onceflow_relay_unqueued_rows_found_total"]; found != 0 {
		t.Fatalf("onceflow_relay_unqueued_rows_found_total = %v, want 0: the trigger queues every replicated row", found)
	}
	rep := e.check(ctx)
	if rep.Committed != 3002 || rep.Seen != 3002 {
		t.Fatalf("%d events, %d records; want 3002 of each", rep.Committed, rep.Seen)
	}
	t.Logf("3,002 replicated rows queued by the trigger, none by the sweep; the late committer published in order")
}
