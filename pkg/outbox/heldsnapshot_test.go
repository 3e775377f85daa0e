package outbox_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestCounterMovesLeaveNoVersionsUnderHeldSnapshot: with a REPEATABLE READ
// snapshot held, enqueueing on one stream through every path (Go Enqueue,
// EnqueueBatch, SQL onceflow.enqueue) never updates the stream's locked
// counter row (an UPDATE per statement left a version the snapshot kept,
// and every later lock walked them all: enqueues on ten streams fell from
// about 900/s to 50/s after 68k events). The counter's moves are inserts
// and exact-key deletes in onceflow.source_seq_moves, whose newest live
// entry is the first a backward index scan meets: the look-up reads the
// same few buffers after 3 moves and after 1,500. The seqs stay 1..n.
func TestCounterMovesLeaveNoVersionsUnderHeldSnapshot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	// One connection enqueues, so that its table statistics can be flushed
	// on demand and read back exactly.
	conn, err := b.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	updates := func() int64 {
		t.Helper()
		if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := conn.QueryRow(ctx, `SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'onceflow.source_seq'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The look-up's walk of the moves' index. While the moves' heap is a
	// few pages the planner may read all of it and sort instead (bounded by
	// the index descent it costs against), which depends on when autovacuum
	// last analyzed the table: that choice is ruled out here.
	lookupBuffers := func() int64 {
		t.Helper()
		var plan []struct {
			Plan struct {
				Hit  int64 `json:"Shared Hit Blocks"`
				Read int64 `json:"Shared Read Blocks"`
			} `json:"Plan"`
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
				SELECT m.last_seq FROM onceflow.source_seq_moves m WHERE m.source = 'held' AND m.topic = 'orders'
				 ORDER BY m.last_seq DESC LIMIT 1`).Scan(&plan)
		}); err != nil || len(plan) != 1 {
			t.Fatalf("explain the counter look-up: %v", err)
		}
		return plan[0].Plan.Hit + plan[0].Plan.Read
	}
	n := 0
	enqueue := func(rounds int) {
		t.Helper()
		for range rounds {
			if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				n++
				if _, err := (outbox.Writer{}).Enqueue(ctx, tx, outbox.Message{Topic: "orders", Source: "held", EventType: "order.created",
					EventID: fmt.Sprintf("go-%d", n), Payload: []byte(`{}`)}); err != nil {
					return err
				}
				n += 2
				if _, err := outbox.EnqueueBatch(ctx, tx, []outbox.Message{
					{Topic: "orders", Source: "held", EventType: "order.created", EventID: fmt.Sprintf("batch-%d", n-1), Payload: []byte(`{}`)},
					{Topic: "orders", Source: "held", EventType: "order.created", EventID: fmt.Sprintf("batch-%d", n), Payload: []byte(`{}`)},
				}); err != nil {
					return err
				}
				n++
				_, err := tx.Exec(ctx, `SELECT onceflow.enqueue('orders', 'held', 'order.created', '{}'::jsonb, $1)`, fmt.Sprintf("sql-%d", n))
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}

	snap, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = snap.Rollback(ctx) }()
	if _, err := snap.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	var seen int
	if err := snap.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&seen); err != nil {
		t.Fatal(err)
	}

	enqueue(1)
	before, small := updates(), lookupBuffers()
	enqueue(500)
	after, large := updates(), lookupBuffers()
	t.Logf("%d events on one stream under a held snapshot: %d updates of the counter row; the counter look-up read %d buffers after 3 moves, %d after %d",
		n, after-before, small, large, 3*501)
	if after != before {
		t.Fatalf("%d updates of onceflow.source_seq while enqueueing %d events: each leaves a version the held snapshot keeps", after-before, n-4)
	}
	if large > small+2 {
		t.Fatalf("the counter look-up read %d buffers after %d moves, %d after 3: it walks the moves the snapshot keeps", large, 3*501, small)
	}
	var rows, lo, hi, live int64
	if err := conn.QueryRow(ctx, `SELECT count(*), min(seq), max(seq), (SELECT count(*) FROM onceflow.source_seq_moves WHERE source = 'held')
		FROM onceflow.outbox WHERE source = 'held'`).Scan(&rows, &lo, &hi, &live); err != nil {
		t.Fatal(err)
	}
	if rows != int64(n) || lo != 1 || hi != int64(n) || live != 1 {
		t.Fatalf("%d rows with seqs %d..%d and %d live moves, want %d rows with seqs 1..%d and one move", rows, lo, hi, live, n, n)
	}
}
