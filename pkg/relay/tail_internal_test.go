package relay

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestTailSweepStopsAtTheBatch: the tail sweep covers ids up to the batch's
// last id, not every id above its start, and an unqueued row it finds below
// that id is taken into the batch in id order. Two rows are written with
// the outbox's triggers off (as logical replication's apply worker writes),
// one among the first batch's ids and one far above them; after the first
// batch the low one is in it, between its neighbours, and the high one is
// still unqueued (the sweep of the old reader, which ran to the newest id
// before each poll, queued it then). Draining the rest publishes the high
// one too, every id once.
func TestTailSweepStopsAtTheBatch(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	rd := testReader(t, Config{DB: db.Pool, BatchMaxRows: 100, BatchMaxBytes: 4 << 20})

	enqueue := func(n int) {
		t.Helper()
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "t", Source: "queued", EventType: "e", Payload: []byte(`{}`)}
		}
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.EnqueueBatch(ctx, tx, msgs)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	unqueued := func(source string) int64 {
		t.Helper()
		var id int64
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload)
				VALUES ($1, 't', $1, 1, 'e', '{}'::bytea) RETURNING id`, source).Scan(&id)
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	enqueue(50)
	low := unqueued("low")
	enqueue(600)
	high := unqueued("high")
	// The tail starts at the lowest id (a new term starts it at the newest
	// less 1,000: here below the first row), and the full walk, which
	// covers every id in its chunk, is not due for a second.
	rd.tailFrom, rd.fullAt = 0, time.Now()

	pending := func(id int64) bool {
		t.Helper()
		var ok bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM onceflow.outbox_pending WHERE id = $1)`, id).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	published := map[int64]int{}
	batch := func() []row {
		t.Helper()
		rows, err := rd.next(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int64, len(rows))
		for i, w := range rows {
			ids[i] = w.id
			published[w.id]++
			if i > 0 && w.id <= rows[i-1].id {
				t.Fatalf("batch out of id order: %d after %d", w.id, rows[i-1].id)
			}
		}
		if len(ids) > 0 {
			if _, err := db.Pool.Exec(ctx, qMarkPublished, ids); err != nil {
				t.Fatal(err)
			}
		}
		return rows
	}

	first := batch()
	if len(first) != 100 {
		t.Fatalf("first batch has %d rows, want 100", len(first))
	}
	if published[low] != 1 || first[50].id != low {
		t.Fatalf("the unqueued row %d below the batch's last id is not 51st in the first batch (ids %d…%d)", low, first[0].id, first[len(first)-1].id)
	}
	if pending(high) {
		t.Fatalf("the unqueued row %d, far above the first batch (last id %d), was queued by its sweep: the tail ran past the batch", high, first[len(first)-1].id)
	}
	for range 100 {
		if len(batch()) == 0 {
			break
		}
	}
	var total int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if len(published) != total || published[high] != 1 {
		t.Fatalf("published %d distinct rows of %d (the high unqueued row %d: %d times)", len(published), total, high, published[high])
	}
	for id, n := range published {
		if n != 1 {
			t.Fatalf("row %d published %d times", id, n)
		}
	}
}

// TestReaderStatementsAreNotJITCompiled: the reader's transaction and its
// idle poll's batch turn JIT compilation off. The sweep's cost estimate is
// far above jit_above_cost, and compiling it took 17–23 ms of a 3.5–4 ms
// tail (about a third of the drain's rate). Here the threshold is lowered
// to 0, so that with JIT on the server would compile the sweep whatever
// its estimate: the plan must have no JIT section.
func TestReaderStatementsAreNotJITCompiled(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	var available bool
	if err := db.Pool.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		t.Fatal("this PostgreSQL has no JIT provider (llvmjit), so the check cannot tell; the Debian postgresql package has it")
	}
	rd := testReader(t, Config{DB: db.Pool, BatchMaxRows: 100, BatchMaxBytes: 4 << 20})
	sweep, args := rd.lay.sharded(qSweep, qSweepShard, int64(0), int64(math.MaxInt64-1))
	plan := func(begin string) string {
		t.Helper()
		var out string
		if err := pgx.BeginTxFunc(ctx, db.Pool, pgx.TxOptions{BeginQuery: begin}, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL jit_above_cost = 0`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sweep, args...).Scan(&out)
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// The check itself: JIT compiles the sweep when it is allowed to.
	if p := plan(`BEGIN ISOLATION LEVEL REPEATABLE READ`); !strings.Contains(p, `"JIT"`) {
		t.Fatalf("with jit_above_cost 0 and JIT on, the sweep was not compiled: the check cannot tell (plan %.300s)", p)
	}
	if p := plan(qBeginWalk); strings.Contains(p, `"JIT"`) {
		t.Errorf("the sweep in a transaction begun by qBeginWalk was JIT-compiled: %.300s", p)
	}
	var jit string
	b := &pgx.Batch{}
	b.Queue(qIndexPlans)
	b.Queue(`SELECT current_setting('jit')`).QueryRow(func(r pgx.Row) error { return r.Scan(&jit) })
	if err := db.Pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if jit != "off" {
		t.Errorf("the idle poll's batch (after qIndexPlans) runs with jit = %s, want off", jit)
	}
}
