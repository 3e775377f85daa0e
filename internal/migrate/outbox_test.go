package migrate_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
)

// The outbox partitions migration keeps the outbox's rows, its queue and
// publish log, while a producer enqueues on another connection: the rows
// of the plain table become the legacy partition, new ones land after
// them, the keys hold, and the relay's queue still names every unpublished
// row. The way down gives back one plain table with every row (those of
// the id-range partitions too), its identity, unique keys and triggers;
// up again works.
func TestOutboxPartitionsMigrationCarriesRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMigrationFixture(t, "outbox_partitions")
	db, parts, conn, exec, text := f.db, f.version, f.conn, f.exec, f.text
	const (
		qRows    = `SELECT coalesce(md5(string_agg(concat_ws('|', id, event_id, topic, source, seq, event_type, payload), E'\n' ORDER BY id)), '') FROM onceflow.outbox WHERE source <> 'during'`
		qPending = `SELECT coalesce(string_agg(p.id::text, ',' ORDER BY p.id), '') FROM onceflow.outbox_pending p JOIN onceflow.outbox o ON o.id = p.id WHERE o.source <> 'during'`
		qLog     = `SELECT coalesce(string_agg(concat_ws('|', batch, first_id, last_id, ids::text), E'\n' ORDER BY batch), '') FROM onceflow.outbox_published`
		qKind    = `SELECT relkind::text FROM pg_class WHERE oid = 'onceflow.outbox'::regclass`
		qDups    = `SELECT count(*)::text FROM (SELECT event_id FROM onceflow.outbox GROUP BY event_id HAVING count(*) > 1) d`
		qQueued  = `SELECT count(*)::text FROM onceflow.outbox o WHERE o.source = 'during' AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_pending p WHERE p.id = o.id)`
	)
	if _, _, err := migrate.To(ctx, conn, parts-1); err != nil {
		t.Fatal(err)
	}
	exec(`SELECT onceflow.enqueue('t', 's' || (g % 3), 'e', '{"n": 1}'::jsonb, 'before-' || g) FROM generate_series(1, 60) g`)
	// The first 40 published in four batches; 20 stay queued.
	for b := range 4 {
		exec(`WITH m AS (DELETE FROM onceflow.outbox_pending WHERE id IN (SELECT id FROM onceflow.outbox ORDER BY id OFFSET $1 LIMIT 10) RETURNING id)
		      INSERT INTO onceflow.outbox_published (first_id, last_id, ids) SELECT min(id), max(id), array_agg(id ORDER BY id) FROM m`, b*10)
	}
	rowsBefore, pendingBefore, logBefore := text(qRows), text(qPending), text(qLog)

	// A producer enqueues on other connections throughout.
	stop := make(chan struct{})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		errs     []error
		enqueued int
	)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload) VALUES ($1, 't', 'during', 'e', '{}')`,
					fmt.Sprintf("during-%d-%d", w, i))
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					enqueued++
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	if _, _, err := migrate.To(ctx, conn, parts); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if len(errs) > 0 || enqueued == 0 {
		t.Fatalf("inserts during the migration: %d ok, errors %v", enqueued, errs)
	}
	if got := text(qKind); got != "p" {
		t.Fatalf("onceflow.outbox relkind %s after the migration, want p", got)
	}
	if got := text(qRows); got != rowsBefore {
		t.Error("the rows changed in the migration")
	}
	if got := text(qPending); got != pendingBefore {
		t.Errorf("queue after the migration:\n%s\nwant\n%s", got, pendingBefore)
	}
	if got := text(qLog); got != logBefore {
		t.Errorf("publish log after the migration:\n%s\nwant\n%s", got, logBefore)
	}
	if n := text(qQueued); n != "0" {
		t.Errorf("%s rows inserted during the migration are not queued", n)
	}
	if got := text(`SELECT string_agg(DISTINCT tableoid::regclass::text, ',') FROM onceflow.outbox`); got != "onceflow.outbox_legacy" {
		t.Errorf("rows lie in %s, want all in the legacy partition", got)
	}
	// Every row has its key in onceflow.outbox_keys (the backfill and the
	// trigger), whose primary key is outbox_event_id_key; the legacy
	// partition's own unique constraint on event_id is gone.
	if got := text(`SELECT format('%s rows, %s keys, %s without', (SELECT count(*) FROM onceflow.outbox), (SELECT count(*) FROM onceflow.outbox_keys),
		(SELECT count(*) FROM onceflow.outbox o WHERE NOT EXISTS (SELECT 1 FROM onceflow.outbox_keys k WHERE k.event_id = o.event_id COLLATE "C" AND k.id = o.id)))`); !strings.HasSuffix(got, " 0 without") || strings.Count(got, text(`SELECT count(*)::text FROM onceflow.outbox`)+" ") != 2 {
		t.Errorf("keys after the migration: %s", got)
	}
	if got := text(`SELECT string_agg(conrelid::regclass::text || '.' || conname, ',' ORDER BY conname) FROM pg_constraint WHERE connamespace = 'onceflow'::regnamespace AND conname LIKE '%event_id_key'`); got != "onceflow.outbox_keys.outbox_event_id_key" {
		t.Errorf("event_id keys after the migration: %s, want onceflow.outbox_keys.outbox_event_id_key only", got)
	}
	// Past the legacy partition's bound: the next rows land in the first
	// range, keys still checked across both.
	exec(`SELECT setval('onceflow.outbox_id_seq', (SELECT to_id - 3 FROM onceflow.outbox_partitions WHERE relname = 'outbox_legacy'))`)
	exec(`SELECT onceflow.enqueue('t', 's1', 'e', '{"n": 2}'::jsonb, 'after-' || g) FROM generate_series(1, 5) g`)
	if got := text(`SELECT string_agg(DISTINCT tableoid::regclass::text, ',' ORDER BY tableoid::regclass::text) FROM onceflow.outbox WHERE event_id LIKE 'after-%'`); got == "onceflow.outbox_legacy" {
		t.Errorf("the rows after the bound lie in %s", got)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.enqueue('t', 's2', 'e', '{}'::jsonb, 'before-1')`); err == nil {
		t.Error("an event_id of the legacy partition was enqueued again in the first range")
	}
	if n := text(qDups); n != "0" {
		t.Errorf("%s event_ids with two rows", n)
	}
	withAfter := text(`SELECT md5(string_agg(concat_ws('|', id, event_id, source, seq), ',' ORDER BY id)) FROM onceflow.outbox`)

	// Down: one plain table, every row.
	if _, _, err := migrate.To(ctx, conn, parts-1); err != nil {
		t.Fatal(err)
	}
	if got := text(qKind); got != "r" {
		t.Fatalf("onceflow.outbox relkind %s after the way down, want r", got)
	}
	if got := text(`SELECT md5(string_agg(concat_ws('|', id, event_id, source, seq), ',' ORDER BY id)) FROM onceflow.outbox`); got != withAfter {
		t.Error("rows lost or changed on the way down")
	}
	if got := text(`SELECT string_agg(conname, ',' ORDER BY conname) FROM pg_constraint WHERE conrelid = 'onceflow.outbox'::regclass AND contype IN ('p', 'u')`); got != "outbox_event_id_key,outbox_pkey,outbox_source_topic_seq_key" {
		t.Errorf("keys after the way down: %s", got)
	}
	if got := text(`SELECT attidentity::text FROM pg_attribute WHERE attrelid = 'onceflow.outbox'::regclass AND attname = 'id'`); got != "a" {
		t.Errorf("id's identity after the way down: %q, want a", got)
	}
	exec(`SELECT onceflow.enqueue('t', 's1', 'e', '{}'::jsonb, 'down-1')`)
	if got := text(`SELECT (id > (SELECT max(id) FROM onceflow.outbox WHERE event_id <> 'down-1'))::text FROM onceflow.outbox WHERE event_id = 'down-1'`); got != "true" {
		t.Error("the identity hands out an id already used")
	}
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.enqueue('t', 's2', 'e', '{}'::jsonb, 'after-1')`); err == nil {
		t.Error("a duplicate event_id was accepted after the way down")
	}
	// Up again.
	if _, _, err := migrate.To(ctx, conn, parts); err != nil {
		t.Fatal(err)
	}
	if got := text(qKind); got != "p" {
		t.Fatalf("onceflow.outbox relkind %s after up again, want p", got)
	}
	exec(`SELECT onceflow.enqueue('t', 's1', 'e', '{}'::jsonb, 'up-again')`)
	if n := text(qDups); n != "0" {
		t.Errorf("%s event_ids with two rows", n)
	}
}

// The way down after retention dropped the legacy partition: a new plain
// table with the keys takes every row.
func TestOutboxPartitionsDownWithoutLegacy(t *testing.T) {
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
	parts := migrationVersion(t, "outbox_partitions")
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
		`SELECT onceflow.enqueue('t', 's' || (g % 2), 'e', '{}'::jsonb, 'ev-' || g) FROM generate_series(1, 20) g`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if got := text(`SELECT coalesce(to_regclass('onceflow.outbox_legacy')::text, 'none')`); got != "none" {
		t.Fatalf("the legacy partition is still there: %s", got)
	}
	rows := text(`SELECT md5(string_agg(concat_ws('|', id, event_id, source, seq), ',' ORDER BY id)) FROM onceflow.outbox`)
	if _, _, err := migrate.To(ctx, conn, parts-1); err != nil {
		t.Fatal(err)
	}
	if got := text(`SELECT md5(string_agg(concat_ws('|', id, event_id, source, seq), ',' ORDER BY id)) FROM onceflow.outbox`); got != rows {
		t.Error("rows lost or changed on the way down")
	}
	if got := text(`SELECT string_agg(conname, ',' ORDER BY conname) FROM pg_constraint WHERE conrelid = 'onceflow.outbox'::regclass AND contype IN ('p', 'u')`); got != "outbox_event_id_key,outbox_pkey,outbox_source_topic_seq_key" {
		t.Errorf("keys after the way down: %s", got)
	}
	if _, err := conn.Exec(ctx, `SELECT onceflow.enqueue('t', 's1', 'e', '{}'::jsonb, 'ev-1')`); err == nil {
		t.Error("a duplicate event_id was accepted after the way down")
	}
	if _, _, err := migrate.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
}
