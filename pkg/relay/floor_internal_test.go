package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestPollCostFlatUnderHeldSnapshot: with a REPEATABLE READ snapshot held
// (no xid, as a report's), the buffers one poll reads do not grow with the
// rows published since the snapshot began. The reader drains 2,000 rows,
// then 18,000 more, marking each batch published as the relay does; after
// each drain one more row is enqueued and the poll statement, with the
// reader's floor, is measured by EXPLAIN (ANALYZE, BUFFERS): a count of
// blocks, whatever the machine's load. Without the floor the poll walks
// every queue entry deleted since the snapshot began (about 20,000 heap
// fetches after the second drain).
func TestPollCostFlatUnderHeldSnapshot(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	cfg := Config{DB: db.Pool, BatchMaxRows: 1000, BatchMaxBytes: 4 << 20}
	rd := testReader(t, cfg)

	holder, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	snap, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := snap.Exec(ctx, `SELECT count(*) FROM onceflow.outbox`); err != nil {
		t.Fatal(err)
	}

	enqueue := func(n int) {
		t.Helper()
		for done := 0; done < n; done += 1000 {
			msgs := make([]outbox.Message, min(1000, n-done))
			for i := range msgs {
				msgs[i] = outbox.Message{Topic: "t", Source: fmt.Sprintf("src-%d", i%64), EventType: "e", Payload: []byte(`{"n":1}`)}
			}
			if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := outbox.EnqueueBatch(ctx, tx, msgs)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	drain := func() {
		t.Helper()
		for {
			rows, err := rd.next(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) == 0 {
				return
			}
			ids := make([]int64, len(rows))
			for i, w := range rows {
				ids[i] = w.id
			}
			if _, err := db.Pool.Exec(ctx, qMarkPublished, ids); err != nil {
				t.Fatal(err)
			}
		}
	}
	// pollBuffers enqueues one row, waits for the floor to rise to just
	// below it and measures the poll that finds that row. (The floor waits
	// for this database's transactions with an xid that began before its
	// mark; other tests' databases on the same server do not hold it.)
	pollBuffers := func() (int64, int) {
		t.Helper()
		enqueue(1)
		var top int64
		if err := db.Pool.QueryRow(ctx, `SELECT max(id) FROM onceflow.outbox`).Scan(&top); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for rd.floor < top-1 {
			if time.Now().After(deadline) {
				t.Logf("the floor stayed at %d, below the last published id %d, for 30 s", rd.floor, top-1)
				break
			}
			if err := rd.raise(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // polling a condition
		}
		// What is measured is the walk of the queue's index from the floor.
		// At these sizes the planner may instead read the queue's whole
		// heap (a hundred pages of entries the held snapshot keeps), which
		// it stops choosing as the heap grows: that choice depends on when
		// autovacuum last analyzed the queue, so it is ruled out here.
		var plan []byte
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+qSelectBatch,
				cfg.BatchMaxRows, []int64{}, int64(cfg.BatchMaxBytes), rd.floor).Scan(&plan)
		}); err != nil {
			t.Fatal(err)
		}
		var p []struct {
			Plan struct {
				Hit    int64 `json:"Shared Hit Blocks"`
				Read   int64 `json:"Shared Read Blocks"`
				Rows   int   `json:"Actual Rows"`
				Filter int64 `json:"Rows Removed by Filter"`
			} `json:"Plan"`
		}
		if err := json.Unmarshal(plan, &p); err != nil || len(p) != 1 {
			t.Fatalf("EXPLAIN output %s: %v", plan, err)
		}
		return p[0].Plan.Hit + p[0].Plan.Read, p[0].Plan.Rows
	}

	enqueue(2000)
	drain()
	small, rows := pollBuffers()
	if rows != 1 {
		t.Fatalf("the poll after 2,000 rows found %d rows, want 1", rows)
	}
	drain()
	enqueue(18000)
	drain()
	large, rows := pollBuffers()
	if rows != 1 {
		t.Fatalf("the poll after 20,000 rows found %d rows, want 1", rows)
	}
	t.Logf("one poll with a snapshot held: %d buffers after 2,000 rows published, %d after 20,000 (floor %d)", small, large, rd.floor)
	// Flat: a few blocks either way (the queue's index root and leaf, the
	// outbox row, the set-aside look-ups). Without the floor the second
	// poll reads tens of thousands.
	if large > small+20 || large > 100 {
		t.Fatalf("one poll read %d buffers after 20,000 rows published under a held snapshot, %d after 2,000: the poll's cost grows with what was published since the snapshot", large, small)
	}
}

// TestOutboxIDDrawnWithXid: a row inserted without a seq (Enqueue, a
// hand-written INSERT) in a transaction that has no xid yet gets an id
// drawn after the transaction took one (migration 024): the identity's id,
// drawn before, is replaced, so the sequence moves by two; a later row of
// the same transaction keeps the identity's id. The scan floor relies on
// it (reader.go). (A draw that WAL-logs the sequence, the first after a
// checkpoint or every 32nd, takes an xid itself and is kept: each attempt
// first inserts a row so that the next draws are not logged, and a
// checkpoint in between makes the attempt inconclusive.)
func TestOutboxIDDrawnWithXid(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	insert := func(tx pgx.Tx, eventID string) int64 {
		t.Helper()
		var id int64
		if err := tx.QueryRow(ctx, `
			INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload)
			VALUES ($1, 't', 's', 'e', '{}') RETURNING id`, eventID).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	var got string
	for attempt := range 3 {
		var before int64
		var ids [2]int64
		_ = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			before = insert(tx, fmt.Sprintf("warm-%d", attempt))
			return nil
		})
		_ = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			for i := range ids {
				ids[i] = insert(tx, fmt.Sprintf("ev-%d-%d", attempt, i))
			}
			return nil
		})
		if ids[0] == before+2 && ids[1] == ids[0]+1 {
			return
		}
		got += fmt.Sprintf(" %v after %d;", ids, before)
	}
	t.Fatalf("ids:%s want the first of each transaction two above the row before (drawn again once the transaction had its xid), the second one above it", got)
}

// TestFloorWaitsOnlyForThisDatabasesWriters: the scan floor waits for a
// transaction of its own database that may still commit a low id, and not
// for one of another database on the same server (xids are server-wide: a
// snapshot's xmin, which the floor used to wait for, is held back by both).
// A writer with an xid is held open in another database while 3,000 rows
// are published: the floor rises to the last of them (with the old wait it
// stayed where it was). Then a writer of this database inserts a row and
// stays open while 3,000 more are published: the floor stays below its id,
// and once it commits, the next poll finds the row.
func TestFloorWaitsOnlyForThisDatabasesWriters(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	other := testkit.EmptyDB(t)
	cfg := Config{DB: db.Pool, BatchMaxRows: 1000, BatchMaxBytes: 4 << 20}
	rd := testReader(t, cfg)

	enqueue := func(n int) {
		t.Helper()
		msgs := make([]outbox.Message, n)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "t", Source: fmt.Sprintf("src-%d", i%16), EventType: "e", Payload: []byte(`{}`)}
		}
		for len(msgs) > 0 {
			k := min(1000, len(msgs))
			if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				_, err := outbox.EnqueueBatch(ctx, tx, msgs[:k])
				return err
			}); err != nil {
				t.Fatal(err)
			}
			msgs = msgs[k:]
		}
	}
	// drain publishes what the polls find and returns the ids seen.
	drain := func() map[int64]bool {
		t.Helper()
		seen := map[int64]bool{}
		for {
			rows, err := rd.next(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) == 0 {
				return seen
			}
			ids := make([]int64, len(rows))
			for i, w := range rows {
				ids[i] = w.id
				seen[w.id] = true
			}
			if _, err := db.Pool.Exec(ctx, qMarkPublished, ids); err != nil {
				t.Fatal(err)
			}
		}
	}
	// settle takes marks and raises the floor until it reaches want, for at
	// most d; it returns where the floor is.
	settle := func(want int64, d time.Duration) int64 {
		t.Helper()
		deadline := time.Now().Add(d)
		for rd.floor < want && time.Now().Before(deadline) {
			if err := rd.raise(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // polling a condition
		}
		return rd.floor
	}
	top := func() int64 {
		t.Helper()
		var id int64
		if err := db.Pool.QueryRow(ctx, `SELECT max(id) FROM onceflow.outbox`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	hold := func(pool interface {
		Begin(context.Context) (pgx.Tx, error)
	}, stmt string) pgx.Tx {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
		if _, err := tx.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
		return tx
	}

	// A writer in another database, with its xid, open throughout.
	hold(other.Pool, `SELECT pg_current_xact_id()`)
	enqueue(3000)
	drain()
	last := top()
	if got := settle(last, 20*time.Second); got < last {
		t.Fatalf("the floor stayed at %d, below the last published id %d, while a transaction of another database held an xid: it waits for writers that cannot insert into this outbox", got, last)
	}

	// A writer of this database: its row's id is drawn, and it stays open.
	w := hold(db.Pool, `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload) VALUES ('late-writer', 't', 'late', 'e', '{}')`)
	var lateID int64
	if err := w.QueryRow(ctx, `SELECT id FROM onceflow.outbox WHERE event_id = 'late-writer'`).Scan(&lateID); err != nil {
		t.Fatal(err)
	}
	enqueue(3000)
	drain()
	after := top()
	// The floor must not pass lateID: give it the time it took above, and more.
	if got := settle(after, 3*time.Second); got >= lateID {
		t.Fatalf("the floor rose to %d, at or above id %d of a transaction of this database still open: its row would be skipped when it commits", got, lateID)
	}
	if err := w.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if seen := drain(); !seen[lateID] {
		t.Fatalf("after its writer committed, no poll found outbox row %d (floor %d)", lateID, rd.floor)
	}
}

// TestPruneKeepsTheHighestPublishedID: on a database whose outbox ids come
// from elsewhere (logical replication writes the source's ids and leaves the
// sequence alone), recovery's restore check learns the highest id ever
// published from the table and the publish log. Retention used to prune
// every old batch, and a subscriber quiet for longer than the retention
// then refused its next start ("the database was restored"). The batch
// holding the highest id is kept with its rows, however old.
func TestPruneKeepsTheHighestPublishedID(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	// Written as the apply worker writes: ids and seqs given, triggers off.
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO onceflow.outbox (id, event_id, topic, source, seq, event_type, payload)
			OVERRIDING SYSTEM VALUE
			SELECT 500 + g, 'replicated-' || g, 't', 's', g, 'e', '{}'::bytea FROM generate_series(1, 50) g`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// Published in five batches of ten, in id order.
	for b := range 5 {
		ids := make([]int64, 10)
		for i := range ids {
			ids[i] = int64(501 + 10*b + i)
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.outbox_pending (id) SELECT unnest($1::bigint[]) ON CONFLICT DO NOTHING`, ids); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, qMarkPublished, ids); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE onceflow.outbox_published SET published_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	var rows, batches int64
	if err := db.Pool.QueryRow(ctx, qPrune, 3600, 1000).Scan(&rows, &batches); err != nil {
		t.Fatal(err)
	}
	var left, top int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(max(last_id), 0) FROM onceflow.outbox_published`).Scan(&left, &top); err != nil {
		t.Fatal(err)
	}
	if rows != 40 || batches != 4 || left != 1 || top != 550 {
		t.Fatalf("pruned %d rows in %d batches, %d log rows left up to id %d; want 40 in 4, the batch up to 550 kept", rows, batches, left, top)
	}
	var last *int64
	if err := db.Pool.QueryRow(ctx, qOutboxLastID).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if last == nil || *last != 550 {
		t.Fatalf("the restore check's highest id after pruning: %v, want 550 (a checkpoint naming 550 would be refused)", last)
	}
}

// TestFloorNeverPassesALateCommit: writers commit one row each as fast as
// they can while a loop raises the floor and consumes the queue above it,
// as the poll does (it deletes the pending ids above the floor, never
// those at or below). A row whose transaction committed while the floor
// rose past its id would be left behind below the floor, to be found only
// by the full walk, after later rows of its source: the relay's one-in-
// ten-thousand reordering under load. At the end no pending id may lie at
// or below the floor.
//
// The floor rises once the oldest writer of this database is younger than
// the mark's xid, and then to just below the lowest pending id. The two
// must be read in that order, by two statements: read by one statement,
// the lowest pending id comes from the statement's snapshot, taken before
// the writers are looked at, and a writer that commits in between is
// missed by both (gone from the writers, invisible in the snapshot).
func TestFloorNeverPassesALateCommit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := testkit.NewDB(t)
	rd := testReader(t, Config{DB: db.Pool, BatchMaxRows: 1000, BatchMaxBytes: 4 << 20})

	const writers = 4
	wctx, stop := context.WithTimeout(ctx, 4*time.Second)
	defer stop()
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for n := 0; wctx.Err() == nil; n++ {
				err := pgx.BeginFunc(wctx, db.Pool, func(tx pgx.Tx) error {
					_, err := outbox.Enqueue(wctx, tx, outbox.Message{Topic: "t", Source: fmt.Sprintf("w%d-%d", w, n%8), EventType: "e", Payload: []byte(`{}`)})
					return err
				})
				if err != nil && wctx.Err() == nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	var raises, consumed int64
	for wctx.Err() == nil {
		if err := rd.raise(ctx); err != nil {
			t.Fatal(err)
		}
		raises++
		tag, err := db.Pool.Exec(ctx, `DELETE FROM onceflow.outbox_pending WHERE id > $1`, rd.floor)
		if err != nil {
			t.Fatal(err)
		}
		consumed += tag.RowsAffected()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var left int64
	var ids []int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(array_agg(id ORDER BY id), '{}') FROM onceflow.outbox_pending WHERE id <= $1`, rd.floor).Scan(&left, &ids); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d raises, %d rows consumed above the floor, floor %d", raises, consumed, rd.floor)
	if consumed == 0 || rd.floor == 0 {
		t.Fatalf("the floor never rose (floor %d, %d rows consumed): nothing was tested", rd.floor, consumed)
	}
	if left > 0 {
		t.Fatalf("%d pending rows lie at or below the floor %d, left behind by it: ids %v", left, rd.floor, ids[:min(len(ids), 20)])
	}
}

// testReader is a reader of one shard with cfg, its metrics unregistered
// and its log discarded.
func testReader(t testing.TB, cfg Config) *reader {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return newReader(cfg, layout{shards: 1}, m, slog.New(slog.DiscardHandler))
}
