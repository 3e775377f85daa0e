package migrate_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/migrate"
)

// TestValidateIDTimeOnAnUpgradedInstall: rows written before migration 036
// were not held to its constraint inbox_id_time. `migrate
// -validate-id-time` checks them: while a row breaks it (a UUIDv7 id more
// than an hour ahead of its event_at), it names the partition and the rows
// and leaves onceflow.inbox_id_time.since alone, so that the probe keeps
// reading the old buckets; once none does, every partition's constraint is
// valid and since is -infinity. A second run changes nothing.
func TestValidateIDTimeOnAnUpgradedInstall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMigrationFixture(t, "inbox_id_time")
	if _, _, err := migrate.To(ctx, f.conn, f.version-1); err != nil {
		t.Fatal(err)
	}
	// A UUIDv7 id made at now() + ahead (the random bits fixed).
	const idAt = `lpad(to_hex((extract(epoch FROM now() + $1::interval) * 1000)::bigint), 12, '0')`
	const id = `substr(` + idAt + `, 1, 8) || '-' || substr(` + idAt + `, 9, 4) || '-7abc-8def-0123456789ab'`
	insert := func(ahead, eventAt string) {
		t.Helper()
		f.exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at)
			VALUES ('c', `+id+`, 's', 1, 't', 'topic', 0, 0, 'processed', 'ttl-3600s', now() + $2::interval)`, ahead, eventAt)
	}
	f.exec(`SELECT onceflow.inbox_ensure_buckets('c', 'ttl-3600s', now())`)
	insert("-10 minutes", "0")         // holds: a bucket
	insert("3 hours", "0")             // breaks it: the same bucket
	insert("-200 hours", "-100 hours") // holds: the default partition (no bucket there)
	bucket := f.text(`SELECT relname FROM onceflow.inbox_buckets WHERE consumer = 'c' AND from_at <= now() AND to_at > now()`)
	if _, _, err := migrate.Up(ctx, f.conn); err != nil {
		t.Fatal(err)
	}
	since := f.text(`SELECT since::text FROM onceflow.inbox_id_time`)
	run := func() (string, error) {
		var out bytes.Buffer
		err := migrate.Command(ctx, "consumer", []string{"-database-url", f.db.URL, "-validate-id-time"}, &out, slog.New(slog.DiscardHandler))
		return out.String(), err
	}

	out, err := run()
	if err == nil || !strings.Contains(err.Error(), "1 partitions hold rows") {
		t.Fatalf("a row breaks it: err %v, want one naming 1 partition\n%s", err, out)
	}
	if !strings.Contains(out, bucket+" holds 1 rows that break it") {
		t.Errorf("output does not name the bucket %s and its row:\n%s", bucket, out)
	}
	if got := f.text(`SELECT since::text FROM onceflow.inbox_id_time`); got != since {
		t.Errorf("since %s after a failed check, want it unchanged (%s)", got, since)
	}
	if got := f.text(`SELECT string_agg(r.relname, ',' ORDER BY r.relname) FROM pg_constraint k JOIN pg_class r ON r.oid = k.conrelid
		WHERE k.conname = 'inbox_id_time' AND NOT k.convalidated`); got != strings.Join([]string{"inbox", bucket}, ",") {
		t.Errorf("partitions still NOT VALID: %s, want inbox and %s", got, bucket)
	}

	f.exec(`DELETE FROM onceflow.inbox WHERE event_id > `+id, "1 hour") // the ids differ in their time only
	out, err = run()
	if err != nil {
		t.Fatalf("nothing breaks it: %v\n%s", err, out)
	}
	if got := f.text(`SELECT since::text FROM onceflow.inbox_id_time`); got != "-infinity" {
		t.Errorf("since %s, want -infinity", got)
	}
	if got := f.text(`SELECT count(*)::text FROM pg_constraint WHERE conname = 'inbox_id_time' AND NOT convalidated`); got != "0" {
		t.Errorf("%s partitions still NOT VALID", got)
	}
	if got := f.text(`SELECT count(*)::text FROM onceflow.inbox`); got != "2" {
		t.Errorf("%s rows left, want the 2 that hold", got)
	}
	out, err = run()
	if err != nil || !strings.Contains(out, "0 partitions checked now") {
		t.Errorf("again: %v\n%s", err, out)
	}
}
