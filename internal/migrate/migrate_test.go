package migrate_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

func TestLoadRejectsHolesAndMissingUp(t *testing.T) {
	t.Parallel()
	cases := map[string]fstest.MapFS{
		"hole": {
			"001_a.up.sql": {Data: []byte("SELECT 1")},
			"003_c.up.sql": {Data: []byte("SELECT 1")},
		},
		"no up": {
			"001_a.down.sql": {Data: []byte("SELECT 1")},
		},
		"two names": {
			"001_a.up.sql":   {Data: []byte("SELECT 1")},
			"001_b.down.sql": {Data: []byte("SELECT 1")},
		},
	}
	for name, fsys := range cases {
		if _, err := migrate.Load(fsys); err == nil {
			t.Errorf("%s: Load accepted it", name)
		}
	}
}

// Two migrators racing on an empty database: the advisory lock makes one wait
// for the other; both end at the latest version and the schema is applied once.
func TestUpConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	latest, err := migrate.Latest()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	tos := make([]int32, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, db.URL)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(ctx)
			_, tos[i], errs[i] = migrate.Up(ctx, conn)
		}()
	}
	wg.Wait()
	for i := range 3 {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		if tos[i] != latest {
			t.Fatalf("migrator %d ended at %d, want %d", i, tos[i], latest)
		}
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	from, to, err := migrate.Up(ctx, conn)
	if err != nil || from != latest || to != latest {
		t.Fatalf("second Up: from %d to %d err %v", from, to, err)
	}
	// Down to zero and up again: the down files undo the up files.
	if _, to, err := migrate.To(ctx, conn, 0); err != nil || to != 0 {
		t.Fatalf("down to 0: to %d err %v", to, err)
	}
	var tables int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'onceflow' AND tablename <> 'schema_version'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d tables left after migrating down to 0", tables)
	}
	if _, to, err := migrate.Up(ctx, conn); err != nil || to != latest {
		t.Fatalf("up again: to %d err %v", to, err)
	}
}

// Down one step at a time from the newest version, then up again: every
// down file undoes its own up file only. Undoing the SQL fencing functions
// (effects_protocol) leaves the ledger's scope column and key of the
// migration before it in place.
func TestDownStepByStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	migs, err := migrate.Load(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	one := func(q string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	const (
		qFuncs = `SELECT count(*) FROM pg_proc WHERE pronamespace = 'onceflow'::regnamespace AND proname LIKE 'effect\_%'`
		qScope = `SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass('onceflow.effects') AND attname = 'scope' AND NOT attisdropped`
		qKey   = `SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass('onceflow.effects') AND contype = 'p' AND array_length(conkey, 1) = 2`
	)
	if _, _, err := migrate.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	body := func() string {
		t.Helper()
		var src string
		if err := conn.QueryRow(ctx, `SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = 'onceflow' AND p.proname = 'enqueue_batch'`).Scan(&src); err != nil {
			t.Fatalf("enqueue_batch: %v", err)
		}
		return src
	}
	sawProtocol := false
	var fastDown string // enqueue_batch's body after the down of enqueue_batch_fast
	for i := len(migs) - 1; i >= 0; i-- {
		m := migs[i]
		if _, to, err := migrate.To(ctx, conn, int32(m.Version-1)); err != nil || to != int32(m.Version-1) {
			t.Fatalf("down from %d (%s): to %d, %v", m.Version, m.Name, to, err)
		}
		if m.Name == "enqueue_batch_fast" {
			fastDown = body()
		}
		if m.Name == "effects_protocol" {
			sawProtocol = true
			if n := one(qFuncs); n != 0 {
				t.Errorf("down of %d_%s left %d effect_ functions", m.Version, m.Name, n)
			}
			if one(qScope) != 1 || one(qKey) != 1 {
				t.Errorf("down of %d_%s dropped the ledger's scope column or (scope, idempotency_key) key", m.Version, m.Name)
			}
		}
	}
	if !sawProtocol {
		t.Fatal("no effects_protocol migration")
	}
	if n := one(`SELECT count(*) FROM pg_proc WHERE pronamespace = 'onceflow'::regnamespace`) +
		one(`SELECT count(*) FROM pg_type t WHERE t.typnamespace = 'onceflow'::regnamespace AND t.typtype IN ('c', 'e', 'd')
		      AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')`); n != 0 {
		t.Errorf("%d functions or types left in schema onceflow at version 0", n)
	}
	// The down of enqueue_batch_fast puts back the body that enqueue_batch
	// (migration 010) creates.
	if fastDown == "" {
		t.Fatal("no enqueue_batch_fast migration")
	}
	for _, m := range migs {
		if m.Name != "enqueue_batch" {
			continue
		}
		if _, to, err := migrate.To(ctx, conn, int32(m.Version)); err != nil || to != int32(m.Version) {
			t.Fatalf("up to %d: to %d, %v", m.Version, to, err)
		}
		if body() != fastDown {
			t.Error("the down of enqueue_batch_fast did not restore enqueue_batch's body of migration enqueue_batch")
		}
	}
	if _, to, err := migrate.Up(ctx, conn); err != nil || to != int32(len(migs)) {
		t.Fatalf("up again: to %d, %v", to, err)
	}
	if one(qFuncs) == 0 || one(qScope) != 1 {
		t.Fatal("up again: the fencing functions or the scope column are missing")
	}
}

// The relay queue migration carries the rows over: unpublished rows into
// the queue, published ones into the publish log with their time (one log
// row per mark), and back again on the way down; a row inserted after it is
// queued by the trigger, whoever inserts it and however.
func TestRelayQueueMigrationCarriesRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	migs, err := migrate.Load(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	var queue int32
	for _, m := range migs {
		if m.Name == "relay_queue" {
			queue = int32(m.Version)
		}
	}
	if queue == 0 {
		t.Fatal("no relay_queue migration")
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	exec := func(q string) {
		t.Helper()
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	text := func(q string) string {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, q).Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return s
	}
	if _, _, err := migrate.To(ctx, conn, queue-1); err != nil {
		t.Fatal(err)
	}
	// Six rows: 1, 2, 5 published in one mark, 3 in another, 4 and 6 not.
	exec(`INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload)
	      SELECT 'e' || g, 't', 's', g, 'x', '\x00' FROM generate_series(1, 6) g`)
	exec(`UPDATE onceflow.outbox SET published_at = '2026-01-01 00:00:00+00' WHERE seq IN (1, 2, 5)`)
	exec(`UPDATE onceflow.outbox SET published_at = '2026-01-02 00:00:00+00' WHERE seq = 3`)

	if _, _, err := migrate.To(ctx, conn, queue); err != nil {
		t.Fatal(err)
	}
	if got := text(`SELECT string_agg(o.seq::text, ',' ORDER BY o.seq) FROM onceflow.outbox_pending p JOIN onceflow.outbox o ON o.id = p.id`); got != "4,6" {
		t.Errorf("pending after up: %s, want 4,6", got)
	}
	if got := text(`SELECT string_agg(to_char(published_at AT TIME ZONE 'UTC', 'MM-DD') || ':' || array_to_string(ids, '+'), ' ' ORDER BY batch) FROM onceflow.outbox_published`); got != "01-01:1+2+5 01-02:3" {
		t.Errorf("publish log after up: %s", got)
	}
	if got := text(`SELECT coalesce(to_char(onceflow.outbox_published_at(3) AT TIME ZONE 'UTC', 'MM-DD'), 'null') || ' ' ||
	                       coalesce(to_char(onceflow.outbox_published_at(4), 'MM-DD'), 'null')`); got != "01-02 null" {
		t.Errorf("outbox_published_at(3), (4): %s", got)
	}
	// New rows, by a plain multi-row INSERT and by COPY, are queued; a
	// deleted row leaves the queue; TRUNCATE empties it.
	exec(`INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload)
	      SELECT 'e' || g, 't', 's', g, 'x', '\x00' FROM generate_series(7, 8) g`)
	if _, err := conn.PgConn().CopyFrom(ctx, strings.NewReader("e9\tt\ts\t9\tx\t\\\\x00\n"),
		`COPY onceflow.outbox (event_id, topic, source, seq, event_type, payload) FROM STDIN`); err != nil {
		t.Fatal(err)
	}
	exec(`DELETE FROM onceflow.outbox WHERE seq = 6`)
	if got := text(`SELECT string_agg(o.seq::text, ',' ORDER BY o.seq) FROM onceflow.outbox_pending p JOIN onceflow.outbox o ON o.id = p.id`); got != "4,7,8,9" {
		t.Errorf("pending after inserts and a delete: %s, want 4,7,8,9", got)
	}
	if got := text(`SELECT count(*)::text FROM onceflow.outbox_pending p WHERE NOT EXISTS (SELECT 1 FROM onceflow.outbox o WHERE o.id = p.id)`); got != "0" {
		t.Errorf("%s queued ids without an outbox row", got)
	}

	// Down: published_at comes back from the log.
	if _, _, err := migrate.To(ctx, conn, queue-1); err != nil {
		t.Fatal(err)
	}
	if got := text(`SELECT string_agg(seq::text || ':' || coalesce(to_char(published_at AT TIME ZONE 'UTC', 'MM-DD'), 'null'), ' ' ORDER BY seq) FROM onceflow.outbox`); got != "1:01-01 2:01-01 3:01-02 4:null 5:01-01 7:null 8:null 9:null" {
		t.Errorf("after down: %s", got)
	}
	if _, _, err := migrate.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	exec(`TRUNCATE onceflow.outbox`)
	if got := text(`SELECT count(*)::text FROM onceflow.outbox_pending`); got != "0" {
		t.Errorf("%s queued ids after TRUNCATE", got)
	}
}

// The streams migration carries a deployment's guard state over: seq_state
// rows, an open gap and its parked event become legacy streams (producer
// and topic ”); afterwards a producer's first event continues its source's
// legacy state without a gap, the legacy gap fills with legacy events and
// releases the parked one, and the enqueue functions refuse a "producer"
// header. The down path goes back to one state per source.
func TestStreamsMigrationCarriesGuardState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	migs, err := migrate.Load(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	var streams int32
	for _, m := range migs {
		if m.Name == "stream_guards" {
			streams = int32(m.Version)
		}
	}
	if streams == 0 {
		t.Fatal("no stream_guards migration")
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	text := func(q string) string {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, q).Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return s
	}
	if _, _, err := migrate.To(ctx, conn, streams-1); err != nil {
		t.Fatal(err)
	}
	// Source a applied up to 5. Source b applied up to 3, 6 parked behind
	// the open gap 4-5.
	exec(`INSERT INTO onceflow.seq_state (consumer, source, last_applied, first_seq) VALUES ('c', 'a', 5, 1), ('c', 'b', 3, 1)`)
	exec(`INSERT INTO onceflow.seq_gaps (consumer, source, from_seq, to_seq, opened_at, deadline)
	      VALUES ('c', 'b', 4, 5, now(), now() + interval '1 hour')`)
	exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, headers, payload)
	      VALUES ('c', 'b-6', 'b', 6, 'x', 'orders', 0, 10, 'parked', '{}', '\x00')`)

	if _, _, err := migrate.To(ctx, conn, streams); err != nil {
		t.Fatal(err)
	}
	if got := text(`SELECT string_agg(source || ':' || producer || ':' || topic || ':' || last_applied, ' ' ORDER BY source) FROM onceflow.seq_state`); got != "a:::5 b:::3" {
		t.Errorf("seq_state after up: %s", got)
	}
	// Today's store runs on today's schema: the rest of the way up.
	if _, _, err := migrate.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	store := &seqguard.PGStore{Consumer: "c"}
	deliver := func(evs ...seqguard.Event) []string {
		t.Helper()
		var applied []string
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var keys []seqguard.Stream
			for _, ev := range evs {
				if _, err := tx.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, producer)
VALUES ('c', $1, $2, $3, 'x', $4, 0, 0, 'processed', now(), $5)`, ev.EventID, ev.Source, ev.Seq, ev.Topic, ev.Producer); err != nil {
					return err
				}
				keys = append(keys, ev.Stream())
			}
			l, err := store.Lock(ctx, tx, keys, time.Now())
			if err != nil {
				return err
			}
			for _, ev := range evs {
				out, err := l.Receive(ctx, ev, l.Now(), seqguard.Policy{})
				if err != nil {
					return err
				}
				for _, a := range out.Apply {
					applied = append(applied, a.Event.EventID)
				}
			}
			return l.Flush(ctx)
		})
		if err != nil {
			t.Fatalf("deliver: %v", err)
		}
		return applied
	}
	ev := func(producer, topic, source string, seq int64) seqguard.Event {
		return seqguard.Event{EventID: fmt.Sprintf("%s%s-%d", producer, source, seq), Producer: producer, Topic: topic, Source: source,
			Seq: seq, EventType: "x"}
	}
	// A producer's stream of a continues the legacy state: 6 applies at once.
	if got := deliver(ev("P", "orders", "a", 6), ev("P", "orders", "a", 7)); strings.Join(got, ",") != "Pa-6,Pa-7" {
		t.Errorf("producer stream of a: applied %v, want Pa-6,Pa-7", got)
	}
	// Another producer whose first seq is at or below the legacy state is
	// not taken for a redelivery: it starts by the start policy (seq 1).
	if got := deliver(ev("Q", "orders", "a", 1)); strings.Join(got, ",") != "Qa-1" {
		t.Errorf("second producer of a: applied %v, want Qa-1", got)
	}
	// Legacy b: 4 and 5 fill the gap and release the parked 6.
	if got := deliver(ev("", "orders", "b", 4), ev("", "orders", "b", 5)); strings.Join(got, ",") != "b-4,b-5,b-6" {
		t.Errorf("legacy b: applied %v, want b-4,b-5,b-6", got)
	}
	if got := text(`SELECT count(*)::text FROM onceflow.seq_gaps WHERE state = 'open'`); got != "0" {
		t.Errorf("%s open gaps, want 0", got)
	}
	// A stream's last_applied: the greater of seq_state's and its newest
	// seq_applied row (migration seq_applied).
	if got := text(`SELECT string_agg(source || ':' || producer || ':' || topic || ':' || greatest(last_applied,
	        (SELECT max(a.last_applied) FROM onceflow.seq_applied a WHERE a.consumer = s.consumer AND a.source = s.source
	            AND a.producer = s.producer AND a.topic = s.topic)), ' ' ORDER BY source, producer) FROM onceflow.seq_state s`); got != "a:::5 a:P:orders:7 a:Q:orders:1 b:::6" {
		t.Errorf("seq_state: %s", got)
	}
	for _, q := range []string{
		`SELECT onceflow.enqueue('t', 's', 'x.y', '{}'::jsonb, NULL, '{"Producer": "me"}'::jsonb)`,
		`SELECT * FROM onceflow.enqueue_batch('[{"topic": "t", "source": "s", "event_type": "x.y", "payload": {}, "headers": {"producer": "me"}}]'::jsonb)`,
	} {
		if _, err := conn.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("%s: %v, want the header refused as reserved", q, err)
		}
	}

	if _, _, err := migrate.To(ctx, conn, streams-1); err != nil {
		t.Fatal(err)
	}
	if got := text(`SELECT string_agg(source || ':' || last_applied, ' ' ORDER BY source) FROM onceflow.seq_state`); got != "a:5 b:6" {
		t.Errorf("seq_state after down: %s", got)
	}
	exec(`SELECT onceflow.enqueue('t', 's', 'x.y', '{}'::jsonb, NULL, '{"producer": "me"}'::jsonb)`)
}
