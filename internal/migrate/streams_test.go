package migrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/migrations"
)

// TestStreamsMigrationCarriesCounters: a database at the version before
// migration streams holds a single-topic source (5 events), a source that
// wrote to two topics (6 events, alternating), and a source whose rows were
// all pruned (counter 3). After the migration each stream continues after
// its source's old last seq (so the single-topic source's consumers see no
// gap and no seq is handed out twice), a new source starts at 1, and the
// producer role that held grants on the old counters holds none on the
// counters. The way down refuses while two rows of one source share a seq
// (one per topic), works once they are gone, restores a per-source counter
// (the highest of the source's streams) and the producer's grants; up again
// continues from there.
func TestStreamsMigrationCarriesCounters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	migs, err := migrate.Load(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	var streams int32
	for _, m := range migs {
		if m.Name == "streams" {
			streams = int32(m.Version)
		}
	}
	if streams == 0 {
		t.Fatal("no streams migration")
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
	one := func(q string, args ...any) string {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, q, args...).Scan(&s); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return s
	}
	enqueue := func(topic, source string) string {
		t.Helper()
		return one(`SELECT seq::text FROM onceflow.enqueue($1, $2, 'x', '{}')`, topic, source)
	}
	to := func(v int32) {
		t.Helper()
		if _, got, err := migrate.To(ctx, conn, v); err != nil || got != v {
			t.Fatalf("migrate to %d: at %d, %v", v, got, err)
		}
	}

	to(streams - 1)
	// A producer role, granted what roles.sql granted writers before.
	var b [4]byte
	_, _ = rand.Read(b[:])
	writer := "mig_writer_" + hex.EncodeToString(b[:])
	exec(`CREATE ROLE ` + writer + ` NOLOGIN`)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), testkit.DatabaseURL(t))
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), `DROP ROLE IF EXISTS `+writer)
	})
	exec(`GRANT SELECT, INSERT, UPDATE ON onceflow.source_seq TO ` + writer)
	exec(`GRANT INSERT (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload), SELECT (event_id, seq) ON onceflow.outbox TO ` + writer)
	for range 5 {
		enqueue("orders", "single")
	}
	for i := range 6 {
		enqueue([2]string{"orders", "emails"}[i%2], "multi")
	}
	for range 3 {
		enqueue("orders", "pruned")
	}
	exec(`DELETE FROM onceflow.outbox WHERE source = 'pruned'`)

	to(streams)
	privs := func(table string) string {
		return one(`SELECT has_table_privilege($1, $2, 'SELECT') || ' ' || has_table_privilege($1, $2, 'UPDATE') || ' ' ||
			has_table_privilege($1, $2, 'INSERT')`, writer, table)
	}
	for _, table := range []string{"onceflow.source_seq", "onceflow.source_seq_legacy"} {
		if got := privs(table); got != "false false false" {
			t.Errorf("after up: the producer role's SELECT, UPDATE, INSERT on %s: %s, want none", table, got)
		}
	}
	got := strings.Join([]string{
		enqueue("orders", "single"), enqueue("orders", "multi"), enqueue("emails", "multi"),
		enqueue("orders", "multi"), enqueue("orders", "pruned"), enqueue("audit", "multi"), enqueue("orders", "fresh"),
	}, " ")
	if want := "6 7 7 8 4 7 1"; got != want {
		t.Fatalf("after up: next seqs of single/orders, multi/orders, multi/emails, multi/orders, pruned/orders, multi/audit, fresh/orders: %s, want %s", got, want)
	}

	// Down: refused while multi has seq 7 on three topics.
	if _, _, err := migrate.To(ctx, conn, streams-1); err == nil || !strings.Contains(err.Error(), "several rows of source 'multi' with seq 7") {
		t.Fatalf("down with one seq on several topics of a source: %v, want a refusal naming source 'multi' and seq 7", err)
	}
	exec(`DELETE FROM onceflow.outbox WHERE source = 'multi' AND topic IN ('emails', 'audit') AND seq = 7`)
	to(streams - 1)
	if got := one(`SELECT string_agg(source || '=' || last_seq, ' ' ORDER BY source) FROM onceflow.source_seq`); got != "fresh=1 multi=8 pruned=4 single=6" {
		t.Errorf("after down: per-source counters %s, want fresh=1 multi=8 pruned=4 single=6", got)
	}
	if got := privs("onceflow.source_seq"); got != "true true true" {
		t.Errorf("after down: the producer role's SELECT, UPDATE, INSERT on the counters: %s, want all three back", got)
	}
	if got := enqueue("emails", "multi"); got != "9" {
		t.Errorf("after down: multi's next seq %s, want 9", got)
	}

	to(streams)
	got = fmt.Sprint(enqueue("orders", "multi"), " ", enqueue("emails", "multi"), " ", enqueue("orders", "single"))
	if got != "10 10 7" {
		t.Errorf("up again: next seqs of multi/orders, multi/emails, single/orders: %s, want 10 10 7", got)
	}
}
