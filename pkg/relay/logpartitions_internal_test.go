package relay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
)

// qPublishAt records ids published $2 ago, as qMarkPublished does but with
// a publish time of the test's choosing, so that no test statement updates
// the log (its partitions' dead tuples count only retention's deletes).
const qPublishAt = `
WITH m AS (DELETE FROM onceflow.outbox_pending WHERE id = ANY($1::bigint[]) RETURNING id)
INSERT INTO onceflow.outbox_published (published_at, first_id, last_id, ids)
SELECT now() - $2::interval, min(id), max(id), array_agg(id ORDER BY id) FROM m HAVING count(*) > 0`

// The publish log's partitions go whole, with the DROP of retention's
// pass, never by a DELETE: a log partition is dropped only once every
// outbox range below its end is gone and its batches are older than the
// retention, never while it holds the batch with the highest last_id, and
// a batch that committed late (its first id in an older range, its last in
// a newer one) keeps its partition until the older range is gone too, even
// after its own range was dropped. The relay's row-by-row prune, which runs
// in the same pass, leaves those batches alone; the log's range partitions
// see no deleted or dead tuple.
func TestPublishLogPartitionsDropWhole(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	bound := legacyBound(t, db)
	// The housekeeping runs on one connection of its own, so that the
	// statistics of what it deleted can be flushed and read there.
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 1
	hk, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hk.Close)
	h := quietHousekeeper(t, Config{DB: hk, Retention: time.Hour, PruneBatchRows: 1000})
	st := dbT{t, db.Pool}
	exec, one, insert := st.exec, st.one, st.insert
	publishAt := func(age string, ids ...int64) {
		t.Helper()
		exec(qPublishAt, ids, age)
	}
	logParts := func() string {
		t.Helper()
		var s string
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(c.relname, ',' ORDER BY c.relname), '') FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'onceflow.outbox_published'::regclass`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Deleted and dead tuples of the log's range partitions, as the
	// housekeeping's connection counted them (flushed first).
	deletes := func() int64 {
		t.Helper()
		if _, err := hk.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := hk.QueryRow(ctx, `SELECT coalesce(sum(n_tup_del + n_dead_tup), 0) FROM pg_stat_user_tables
			WHERE schemaname = 'onceflow' AND relname LIKE 'outbox\_published\_p\_%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	pass := func() {
		t.Helper()
		if err := h.prune(ctx); err != nil {
			t.Fatal(err)
		}
		if n := deletes(); n != 0 {
			t.Fatalf("%d tuples deleted or dead in the publish log's range partitions after a pass", n)
		}
	}
	expect := func(when string, kept, gone []string) {
		t.Helper()
		now := logParts()
		for _, n := range kept {
			if !contains(now, n) {
				t.Errorf("%s: log partition %s dropped: %s", when, n, now)
			}
		}
		for _, n := range gone {
			if contains(now, n) {
				t.Errorf("%s: log partition %s kept: %s", when, n, now)
			}
		}
	}

	// The log's legacy bound is the outbox's in a new database.
	if lb := one(`SELECT to_id FROM onceflow.outbox_published_partitions WHERE relname = 'outbox_published_legacy'`); lb != bound {
		t.Fatalf("the publish log's legacy bound is %d, want the outbox's, %d", lb, bound)
	}
	// Outbox ranges of 100 ids from bound + 1,000,000 on: A, B, C, D.
	w := int64(1000000)
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w-3)
	exec(`SELECT onceflow.outbox_ensure_partitions(100)`)
	first := insert(2, "f") // the first range's last two ids
	pA := insert(10, "a")
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w+100)
	exec(`SELECT onceflow.outbox_ensure_partitions()`)
	pB := insert(10, "b")
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w+200)
	exec(`SELECT onceflow.outbox_ensure_partitions()`)
	pC := insert(5, "c")
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w+300)
	exec(`SELECT onceflow.outbox_ensure_partitions()`)
	logFirst, logA, logB := "outbox_published_p_"+itoa(bound), "outbox_published_p_"+itoa(bound+w), "outbox_published_p_"+itoa(bound+w+100)
	logC, logD := "outbox_published_p_"+itoa(bound+w+200), "outbox_published_p_"+itoa(bound+w+300)
	expect("made with the ranges", []string{"outbox_published_legacy", "outbox_published_default", logFirst, logA, logB, logC, logD}, nil)

	publishAt("2 hours", first...)
	publishAt("2 hours", pA[1:]...)
	publishAt("2 hours", pB[:9]...)
	// A's first row committed late: it is published with B's last, in a
	// batch whose last_id lies in B and first_id in A.
	publishAt("2 hours", pA[0], pB[9])
	// C's batch is younger than the retention (an hour) for now.
	publishAt("30 minutes", pC...)
	// A row of A is set aside and not resolved: A stays.
	exec(`INSERT INTO onceflow.outbox_set_aside (outbox_id, event_id, topic, source, seq, event_type, reason, error)
		SELECT id, event_id, topic, source, seq, event_type, 'test', 'test' FROM onceflow.outbox WHERE id = $1`, pA[3])
	if where := one(`SELECT count(*) FROM onceflow.outbox_published WHERE tableoid = $1::regclass AND first_id = $2`, "onceflow."+logB, pA[0]); where != 1 {
		t.Fatalf("the late batch is not in %s", logB)
	}

	pass()
	// B's range is gone, but its log partition holds the late batch, which
	// names a row of A: it stays until A is gone too, and so does every
	// batch in it (the row-by-row prune leaves them).
	expect("pass 1", []string{logA, logB, logC, logD, "outbox_published_default"}, []string{"outbox_published_legacy", logFirst})
	if n := one(`SELECT count(*) FROM onceflow.outbox_partitions WHERE relname = 'outbox_p_' || $1::bigint`, bound+w+100); n != 0 {
		t.Fatalf("the outbox range B was not dropped")
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_published WHERE tableoid = $1::regclass`, "onceflow."+logB); n != 2 {
		t.Errorf("%d batches left in %s, want B's two", n, logB)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox WHERE id = $1 AND onceflow.outbox_published_at(id) IS NOT NULL`, pA[0]); n != 1 {
		t.Errorf("the late row of A lost its publish time")
	}

	// A's row resolved: A goes, then A's and B's log partitions.
	exec(`UPDATE onceflow.outbox_set_aside SET resolved_at = now(), resolution = 'skipped'`)
	pass()
	expect("pass 2", []string{logC, logD}, []string{logA, logB})

	// C's batch is older than a retention of ten minutes: C's range goes,
	// but its log partition holds the newest batch.
	h.cfg.Retention = 10 * time.Minute
	pass()
	if n := one(`SELECT count(*) FROM onceflow.outbox WHERE source = 'c'`); n != 0 {
		t.Fatalf("%d rows of C left", n)
	}
	expect("pass 3", []string{logC, logD}, nil)
	top := one(`SELECT max(last_id) FROM onceflow.outbox_published`)
	if top != pC[len(pC)-1] {
		t.Errorf("the highest last_id in the log is %d, want C's last id %d", top, pC[len(pC)-1])
	}

	// A later batch (in D, whose ids are not all drawn yet) takes the top:
	// C's log partition goes, D's stays; but not while a reader holds the
	// log (the pass does not wait for it, and tries again at the next).
	publishAt("20 minutes", insert(1, "d")...)
	reader, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx) //nolint:errcheck
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM onceflow.outbox_published`); err != nil {
		t.Fatal(err)
	}
	pass()
	expect("pass 4, a reader holding the log", []string{logC, logD}, nil)
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	pass()
	expect("pass 4", []string{logD, "outbox_published_default"}, []string{logC})
	if n := one(`SELECT count(*) FROM onceflow.outbox_published_partitions WHERE dropped_at IS NOT NULL AND relname LIKE 'outbox\_published\_dropped@%'`); n != 5 {
		t.Errorf("%d log partitions listed as dropped, want 5 (legacy, first, A, B, C)", n)
	}

	// The statistics read above are those of the housekeeping's deletes: a
	// delete on its connection shows in them.
	if _, err := hk.Exec(ctx, `DELETE FROM onceflow.outbox_published WHERE tableoid = $1::regclass`, "onceflow."+logD); err != nil {
		t.Fatal(err)
	}
	if n := deletes(); n == 0 {
		t.Errorf("a delete in %s does not show in the statistics", logD)
	}
}

// A range whose log partition cannot be made at once (its default
// partition is locked by a reader) gets it at a later pass, and the pass
// goes on meanwhile; a range whose batches reached the log's default
// partition first gets none (they stay there, pruned row by row), and the
// ranges after it get theirs.
func TestPublishLogPartitionMadeLater(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	bound := legacyBound(t, db)
	h := quietHousekeeper(t, Config{DB: db.Pool, Retention: time.Hour})
	exec := dbT{t, db.Pool}.exec
	text := func(q string, args ...any) string {
		t.Helper()
		var s string
		if err := db.Pool.QueryRow(ctx, q, args...).Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return s
	}
	const qLogOf = `SELECT coalesce((SELECT relname FROM onceflow.outbox_published_partitions WHERE to_id = $1::bigint), 'none')`
	w := int64(1000000)
	// A reader holds the log's default partition.
	reader, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx) //nolint:errcheck
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM onceflow.outbox_published_default`); err != nil {
		t.Fatal(err)
	}
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w-3)
	if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
		t.Fatalf("a pass while the log's default partition is locked: %v", err)
	}
	next := bound + 2*w // the range made by the pass
	if got := text(`SELECT relname FROM onceflow.outbox_partitions WHERE to_id = $1::bigint`, next); got != "outbox_p_"+itoa(bound+w) {
		t.Fatalf("outbox range to %d: %s", next, got)
	}
	if got := text(qLogOf, next); got != "none" {
		t.Fatalf("log partition of the range made while its default partition was locked: %s", got)
	}
	// The reader ends: the next pass makes it.
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
		t.Fatal(err)
	}
	if got := text(qLogOf, next); got != "outbox_published_p_"+itoa(bound+w) {
		t.Fatalf("log partition of the range after the reader ended: %s", got)
	}

	// Once more, but a batch of the range reaches the log first: the pass
	// makes the outbox's ranges to early and to early + w (one ahead), the
	// log's default partition locked.
	reader, err = db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx) //nolint:errcheck
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM onceflow.outbox_published_default`); err != nil {
		t.Fatal(err)
	}
	early := next + w
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, early-3)
	if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
		t.Fatal(err)
	}
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, early+5)
	exec(qInsertOne, "early", "s")
	exec(qPublishAt, []int64{early + 6}, "0")
	if got := text(`SELECT tableoid::regclass::text FROM onceflow.outbox_published WHERE last_id = $1::bigint`, early+6); got != "onceflow.outbox_published_default" {
		t.Fatalf("the early batch lies in %s", got)
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, early+w-3)
	if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
		t.Fatal(err)
	}
	if got := text(qLogOf, early+w); got != "outbox_published_default@"+itoa(early) {
		t.Errorf("log partition of the range whose batch reached the default partition first: %s", got)
	}
	if got := text(qLogOf, early+2*w); got != "outbox_published_p_"+itoa(early+w) {
		t.Errorf("log partition of the range after it: %s", got)
	}
	if got := text(`SELECT tableoid::regclass::text FROM onceflow.outbox_published WHERE last_id = $1::bigint`, early+6); got != "onceflow.outbox_published_default" {
		t.Errorf("the early batch moved to %s", got)
	}
}

// A range taken by the outbox's default partition (its rows were there
// before the range could be made) is listed as emptied from the start, but
// its rows stay in the default partition until the row-by-row prune: the
// expiry of a neighbouring range must not delete the log row of a batch
// that also holds one of those rows. Without its log row and out of the
// queue, such a row looks never queued to the relay's sweep, which would
// queue it and publish it a second time.
func TestExpireKeepsTheLogOfRowsLeftInTheDefaultPartition(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	bound := legacyBound(t, db)
	h := quietHousekeeper(t, Config{DB: db.Pool, Retention: time.Hour})
	st := dbT{t, db.Pool}
	exec, one := st.exec, st.one
	const w = int64(1000000)
	// Range R = [bound + w, bound + 2w) is made (with the one after it, the
	// housekeeping's lead) and gets a row; then a row of range D = [bound +
	// 3w, bound + 4w) lands in the default partition before D is made, so
	// the next pass records D as taken by it.
	r, d := bound+w, bound+3*w
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, r+10)
	if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
		t.Fatal(err)
	}
	exec(qInsertOne, "in-r", "s-r") // id r + 11
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, d+10)
	exec(qInsertOne, "in-default", "s-d") // id d + 11
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, d+20)
	if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
		t.Fatal(err)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_partitions WHERE from_id = $1::bigint AND relname LIKE 'outbox\_default@%'`, d); n != 1 {
		t.Fatalf("range %d is not recorded as taken by the default partition", d)
	}
	// One batch holds the row of R and the row of D, published two hours
	// ago; a later batch is the newest (recovery's, never pruned).
	exec(qPublishAt, []int64{r + 11, d + 11}, "2 hours")
	exec(qInsertOne, "newest", "s-n") // id d + 21, in the default partition too
	exec(qPublishAt, []int64{d + 21}, "0")
	// R expires: every id drawn, none queued, its batch past the retention.
	if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
		t.Fatal(err)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_partitions WHERE from_id = $1::bigint AND truncated_at IS NOT NULL`, r); n != 1 {
		t.Fatalf("range R was not emptied by the pass")
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox WHERE id = $1::bigint`, d+11); n != 1 {
		t.Fatalf("the row of D is gone from the default partition (%d)", n)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_published WHERE $1::bigint = ANY (ids)`, d+11); n != 1 {
		t.Errorf("the log row of the batch holding the default partition's row was deleted with range R: the row looks never queued")
	}
}
