package migrate_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
)

// qMark publishes the oldest pending rows, up to $1 of them, as the relay
// marks a batch: out of the queue, one log row.
const qMark = `
WITH m AS (DELETE FROM onceflow.outbox_pending WHERE id IN (SELECT id FROM onceflow.outbox_pending ORDER BY id LIMIT $1) RETURNING id)
INSERT INTO onceflow.outbox_published (first_id, last_id, ids)
SELECT min(id), max(id), array_agg(id ORDER BY id) FROM m HAVING count(*) > 0`

// The publish log partitions migration keeps the log's rows while the
// relay marks batches on another connection: the plain table becomes the
// legacy partition (below a bound above every last_id, at an end of the
// outbox's ranges), with its rows, batch numbers, grants (table and
// column) and indexes; the next batch numbers continue; each outbox range
// above the bound gets its log partition; publish times are still found.
// The way down gives back one plain table with every row (those of the
// range partitions too), its primary key on batch, identity and grants; up
// again works.
func TestPublishedPartitionsMigrationCarriesLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMigrationFixture(t, "published_partitions")
	db, version, conn, exec, text := f.db, f.version, f.conn, f.exec, f.text
	const (
		qLog   = `SELECT coalesce(md5(string_agg(concat_ws('|', batch, published_at, first_id, last_id, ids::text), E'\n' ORDER BY batch)), '') FROM onceflow.outbox_published`
		qKind  = `SELECT relkind::text FROM pg_class WHERE oid = 'onceflow.outbox_published'::regclass`
		qParts = `SELECT string_agg(c.relname || ' ' || pg_get_expr(c.relpartbound, c.oid), '; ' ORDER BY c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'onceflow.outbox_published'::regclass`
	)
	// Two roles of this test: one with table privileges, one with column
	// privileges (as deploy/sql/roles.sql gives the relay and the reader).
	relay, reader := "pp_relay_"+db.Name, "pp_reader_"+db.Name
	for _, r := range []string{relay, reader} {
		exec(`CREATE ROLE ` + pgx.Identifier{r}.Sanitize())
	}
	t.Cleanup(func() {
		for _, r := range []string{relay, reader} {
			_, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+pgx.Identifier{r}.Sanitize())
			_, _ = db.Pool.Exec(context.Background(), `DROP ROLE `+pgx.Identifier{r}.Sanitize())
		}
	})
	if _, _, err := migrate.To(ctx, conn, version-1); err != nil {
		t.Fatal(err)
	}
	exec(`GRANT SELECT, INSERT, UPDATE, DELETE ON onceflow.outbox_published TO ` + pgx.Identifier{relay}.Sanitize())
	exec(`GRANT SELECT (batch, published_at, first_id, last_id, ids) ON onceflow.outbox_published TO ` + pgx.Identifier{reader}.Sanitize())
	// Rows in the outbox's legacy partition and in its first range, and a
	// range ahead, published in batches of 7.
	exec(`SELECT onceflow.enqueue('t', 's' || (g % 3), 'e', '{}'::jsonb) FROM generate_series(1, 30) g`)
	exec(`SELECT setval('onceflow.outbox_id_seq', (SELECT to_id + 10 FROM onceflow.outbox_partitions WHERE relname = 'outbox_legacy'))`)
	exec(`SELECT onceflow.enqueue('t', 's' || (g % 3), 'e', '{}'::jsonb) FROM generate_series(1, 30) g`)
	exec(`SELECT onceflow.outbox_ensure_partitions()`)
	for range 8 {
		exec(qMark, 7)
	}
	logBefore := text(qLog)
	topBefore := text(`SELECT max(batch)::text FROM onceflow.outbox_published`)
	lastID := text(`SELECT max(last_id)::text FROM onceflow.outbox_published`)
	oldID := text(`SELECT (ids[2])::text FROM onceflow.outbox_published ORDER BY batch LIMIT 1`)
	atBefore := text(`SELECT onceflow.outbox_published_at($1::bigint)::text`, oldID)
	drawn := text(`SELECT last_value::text FROM onceflow.outbox_id_seq`)

	// The relay goes on enqueueing and marking throughout.
	stop := make(chan struct{})
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
		marked int
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, err := db.Pool.Exec(ctx, `SELECT onceflow.enqueue('t', 'during', 'e', '{}'::jsonb, $1)`, fmt.Sprintf("during-%d", i))
			if err == nil {
				_, err = db.Pool.Exec(ctx, qMark, 3)
			}
			mu.Lock()
			if err != nil {
				errs = append(errs, err)
			} else {
				marked++
			}
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	if _, _, err := migrate.To(ctx, conn, version); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if len(errs) > 0 || marked == 0 {
		t.Fatalf("marks during the migration: %d ok, errors %v", marked, errs)
	}

	if got := text(qKind); got != "p" {
		t.Fatalf("onceflow.outbox_published relkind %s after the migration, want p", got)
	}
	if got := text(qLog+` WHERE batch <= $1::bigint`, topBefore); got != logBefore {
		t.Error("the log's rows changed in the migration")
	}
	if got := text(`SELECT count(*)::text FROM onceflow.outbox_published WHERE batch <= $1::bigint AND tableoid <> 'onceflow.outbox_published_legacy'::regclass`, topBefore); got != "0" {
		t.Errorf("%s rows from before the migration outside the legacy partition", got)
	}
	// The bound: above every last_id and one range width above the ids
	// drawn, at an end of one of the outbox's ranges.
	bound := text(`SELECT to_id::text FROM onceflow.outbox_published_partitions WHERE relname = 'outbox_published_legacy'`)
	if got := text(`SELECT ($1::bigint > $2::bigint AND $1::bigint >= $3::bigint + 1000000
		AND EXISTS (SELECT 1 FROM onceflow.outbox_partitions WHERE to_id = $1::bigint))::text`, bound, lastID, drawn); got != "true" {
		t.Errorf("the legacy bound %s: not above the last_ids (%s), one width above the ids drawn (%s) and at an outbox range's end", bound, lastID, drawn)
	}
	// Every outbox range above the bound has its log partition, aligned.
	if got := text(`SELECT count(*)::text FROM onceflow.outbox_partitions p WHERE p.relname LIKE 'outbox\_p\_%' AND p.to_id > $1::bigint
		AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.relname = 'outbox_published_p_' || p.from_id
		                  AND pg_get_expr(c.relpartbound, c.oid) = format('FOR VALUES FROM (''%s'') TO (''%s'')', p.from_id, p.to_id))`, bound); got != "0" {
		t.Errorf("%s outbox ranges above the bound without their log partition: %s", got, text(qParts))
	}
	// The batch numbers go on.
	exec(`SELECT onceflow.enqueue('t', 'after', 'e', '{}'::jsonb)`)
	exec(qMark, 1000)
	if got := text(`SELECT (min(batch) > $1::bigint)::text FROM onceflow.outbox_published WHERE batch > $1::bigint`, topBefore); got != "true" {
		t.Error("a batch number was handed out again")
	}
	if got := text(`SELECT onceflow.outbox_published_at($1::bigint)::text`, oldID); got != atBefore {
		t.Errorf("outbox_published_at(%s) %s after the migration, want %s", oldID, got, atBefore)
	}
	// The grants, the keys and the indexes.
	grants := `SELECT format('%s %s %s %s', has_table_privilege($1, 'onceflow.outbox_published', 'DELETE'), has_table_privilege($1, 'onceflow.outbox_published', 'UPDATE'),
		has_column_privilege($2, 'onceflow.outbox_published', 'ids', 'SELECT'), has_table_privilege($2, 'onceflow.outbox_published', 'SELECT'))`
	if got := text(grants, relay, reader); got != "t t t f" {
		t.Errorf("grants after the migration: %s, want the relay's table privileges and the reader's column ones", got)
	}
	if got := text(`SELECT string_agg(conname || ' ' || pg_get_constraintdef(oid), ', ' ORDER BY conname) FROM pg_constraint WHERE conrelid = 'onceflow.outbox_published'::regclass AND contype IN ('p', 'u')`); got != "outbox_published_pkey PRIMARY KEY (batch, last_id)" {
		t.Errorf("keys after the migration: %s", got)
	}
	if got := text(`SELECT string_agg(indexrelid::regclass::text, ',' ORDER BY indexrelid::regclass::text) FROM pg_index WHERE indrelid = 'onceflow.outbox_published'::regclass`); got != "onceflow.outbox_published_id_span,onceflow.outbox_published_last_id,onceflow.outbox_published_pkey,onceflow.outbox_published_published_at" {
		t.Errorf("indexes after the migration: %s", got)
	}
	if got := text(`SELECT count(*)::text FROM pg_index i JOIN pg_inherits h ON h.inhrelid = i.indexrelid WHERE i.indrelid = 'onceflow.outbox_published_legacy'::regclass`); got != "4" {
		t.Errorf("%s of the legacy partition's indexes attached to the partitioned table's, want 4", got)
	}
	// The ranges made from now on get their log partitions with them, and
	// a batch above the bound lands in its range's.
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint + 5)`, bound)
	exec(`SELECT onceflow.outbox_ensure_partitions()`)
	if got := text(`SELECT count(*)::text FROM onceflow.outbox_partitions p WHERE p.relname LIKE 'outbox\_p\_%' AND p.to_id > $1::bigint
		AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.relname = 'outbox_published_p_' || p.from_id
		                  AND pg_get_expr(c.relpartbound, c.oid) = format('FOR VALUES FROM (''%s'') TO (''%s'')', p.from_id, p.to_id))`, bound); got != "0" {
		t.Errorf("%s outbox ranges made after the migration without their log partition: %s", got, text(qParts))
	}
	exec(`SELECT onceflow.enqueue('t', 'above', 'e', '{}'::jsonb)`)
	exec(qMark, 1000)
	if got := text(`SELECT tableoid::regclass::text FROM onceflow.outbox_published ORDER BY batch DESC LIMIT 1`); got != "onceflow.outbox_published_p_"+bound {
		t.Errorf("the batch above the bound lies in %s", got)
	}
	all := text(qLog)
	lastBatch := text(`SELECT max(batch)::text FROM onceflow.outbox_published`)

	// Down: one plain table, every row.
	if _, _, err := migrate.To(ctx, conn, version-1); err != nil {
		t.Fatal(err)
	}
	if got := text(qKind); got != "r" {
		t.Fatalf("onceflow.outbox_published relkind %s after the way down, want r", got)
	}
	if got := text(qLog); got != all {
		t.Error("the log's rows lost or changed on the way down")
	}
	if got := text(`SELECT string_agg(conname || ' ' || pg_get_constraintdef(oid), ', ' ORDER BY conname) FROM pg_constraint WHERE conrelid = 'onceflow.outbox_published'::regclass AND contype IN ('p', 'u', 'c')`); got != "outbox_published_ids_not_empty CHECK ((cardinality(ids) > 0)), outbox_published_pkey PRIMARY KEY (batch)" {
		t.Errorf("constraints after the way down: %s", got)
	}
	if got := text(`SELECT string_agg(indexrelid::regclass::text, ',' ORDER BY indexrelid::regclass::text) FROM pg_index WHERE indrelid = 'onceflow.outbox_published'::regclass`); got != "onceflow.outbox_published_id_span,onceflow.outbox_published_last_id,onceflow.outbox_published_pkey,onceflow.outbox_published_published_at" {
		t.Errorf("indexes after the way down: %s", got)
	}
	if got := text(grants, relay, reader); got != "t t t f" {
		t.Errorf("grants after the way down: %s", got)
	}
	exec(`SELECT onceflow.enqueue('t', 'down', 'e', '{}'::jsonb)`)
	exec(qMark, 1000)
	if got := text(`SELECT (max(batch) > $1::bigint)::text FROM onceflow.outbox_published`, lastBatch); got != "true" {
		t.Error("the identity hands out a batch number already used after the way down")
	}
	// Up again.
	if _, _, err := migrate.To(ctx, conn, version); err != nil {
		t.Fatal(err)
	}
	if got := text(qKind); got != "p" {
		t.Fatalf("onceflow.outbox_published relkind %s after up again, want p", got)
	}
	exec(`SELECT onceflow.enqueue('t', 'up-again', 'e', '{}'::jsonb)`)
	exec(qMark, 1000)
}

// The way down after retention dropped the log's legacy partition: a new
// plain table with the primary key on batch takes every row.
func TestPublishedPartitionsDownWithoutLegacy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, _, err := migrate.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	version := migrationVersion(t, "published_partitions")
	text := func(q string) string {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, q).Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return s
	}
	for _, q := range []string{
		`SELECT setval('onceflow.outbox_id_seq', (SELECT to_id FROM onceflow.outbox_partitions WHERE relname = 'outbox_legacy'))`,
		`SELECT onceflow.outbox_expire_partition(-9223372036854775808, interval '1 hour')`,
		`SELECT onceflow.outbox_drop_partition(-9223372036854775808)`,
		`SELECT count(*) FROM onceflow.outbox_published_drop_partitions(interval '1 hour')`,
		`SELECT onceflow.enqueue('t', 's' || (g % 2), 'e', '{}'::jsonb, 'ev-' || g) FROM generate_series(1, 20) g`,
		qMark,
	} {
		var err error
		if q == qMark {
			_, err = conn.Exec(ctx, q, 7)
		} else {
			_, err = conn.Exec(ctx, q)
		}
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if got := text(`SELECT coalesce(to_regclass('onceflow.outbox_published_legacy')::text, 'none')`); got != "none" {
		t.Fatalf("the log's legacy partition is still there: %s", got)
	}
	rows := text(`SELECT md5(string_agg(concat_ws('|', batch, first_id, last_id, ids::text), ',' ORDER BY batch)) FROM onceflow.outbox_published`)
	if _, _, err := migrate.To(ctx, conn, version-1); err != nil {
		t.Fatal(err)
	}
	if got := text(`SELECT md5(string_agg(concat_ws('|', batch, first_id, last_id, ids::text), ',' ORDER BY batch)) FROM onceflow.outbox_published`); got != rows {
		t.Error("rows lost or changed on the way down")
	}
	if got := text(`SELECT string_agg(conname, ',' ORDER BY conname) FROM pg_constraint WHERE conrelid = 'onceflow.outbox_published'::regclass AND contype IN ('p', 'u')`); got != "outbox_published_pkey" {
		t.Errorf("keys after the way down: %s", got)
	}
	if _, _, err := migrate.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
}
