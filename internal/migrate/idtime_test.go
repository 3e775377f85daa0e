package migrate_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
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

// TestIDTimeHoldsIsTheRuleOfMigration036: the function that checks
// inbox_id_time since migration 038 (a comparison of hex digits first, the
// regular expression and the exact time only for an id that fails it) gives
// what the expression of migration 036 gave, for every lane, id and time
// of a corpus made to sit on the edges: a microsecond and a millisecond
// either side of each UUIDv7's floor (random ones up to the year 10889,
// more of them in 2020-2039),
// times either side of 1970 and of 2106, infinities, and ids that are not
// UUIDv7s by one character.
func TestIDTimeHoldsIsTheRuleOfMigration036(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t)
	const old = `(lane = 'legacy'
    OR event_id !~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
    OR event_at >= 'epoch'::timestamptz
                   + ((('x' || substr(event_id, 1, 8) || substr(event_id, 10, 4))::bit(48)::bigint) / 1000) * interval '1 second'
                   + ((('x' || substr(event_id, 1, 8) || substr(event_id, 10, 4))::bit(48)::bigint) % 1000) * interval '1 millisecond'
                   - interval '1 hour')`
	const q = `
WITH ms(v) AS (
    SELECT unnest(ARRAY[0, 1, 999, 1000, 3599999, 3600000, 3600001, 1733333333333, 4291747199999, 4291747200000,
                        4291750799999, 4291750800000, 253370764800000, 281474976710655]::bigint[])
    UNION ALL
    SELECT (random() * 281474976710655)::bigint FROM generate_series(1, 40)
    UNION ALL -- 2020-2039: today's ids, the ones the comparison of hex digits takes
    SELECT 1577836800000 + (random() * 631152000000)::bigint FROM generate_series(1, 100)
    UNION ALL
    SELECT (random() * 4291747200000)::bigint FROM generate_series(1, 40)
), v7 AS (
    SELECT v, substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7abc-8def-0123456789ab' AS id,
           'epoch'::timestamptz + (v / 1000) * interval '1 second' + (v % 1000) * interval '1 millisecond' - interval '1 hour' AS floor
      FROM ms, lpad(to_hex(v), 12, '0') AS h
), ids(id, floor) AS (
    SELECT id, floor FROM v7
    UNION ALL
    SELECT x, floor FROM v7, unnest(ARRAY[
        upper(id), overlay(id placing '6' from 15), overlay(id placing 'c' from 20), substr(id, 1, 35), id || '0',
        '{' || substr(id, 2, 34) || '}', replace(id, '-', '') || 'abcd', overlay(id placing 'é' from 3 for 2), ''
    ]) AS x
), times(id, at) AS (
    SELECT id, floor + d FROM ids, unnest(ARRAY['-1 millisecond', '-1 microsecond', '0', '1 microsecond', '1 millisecond']::interval[]) AS d
     WHERE floor > '-infinity' AND floor < 'infinity'
    UNION ALL
    SELECT id, a FROM ids, unnest(ARRAY['-infinity', 'infinity', '1969-12-31 23:59:59.999999+00', '1970-01-01 00:00:00+00',
        '2105-12-31 23:59:59.999999+00', '2106-01-01 00:00:00+00', '100000-01-01 00:00:00+00']::timestamptz[]) AS a
), rows(lane, event_id, event_at) AS (
    SELECT lane, id, at FROM times, unnest(ARRAY['legacy', 'ttl-60s']) AS lane
)
SELECT count(*), count(*) FILTER (WHERE ` + old + `),
       coalesce(string_agg(format('%s %s %s: old %s', lane, event_id, event_at, ` + old + `), E'\n')
           FILTER (WHERE ` + old + ` IS DISTINCT FROM onceflow.inbox_id_time_holds(lane, event_id, event_at)), '')
  FROM rows`
	var n, held int
	var differ string
	if err := db.Pool.QueryRow(context.Background(), q).Scan(&n, &held, &differ); err != nil {
		t.Fatal(err)
	}
	if differ != "" {
		t.Errorf("onceflow.inbox_id_time_holds differs from migration 036's rule:\n%s", differ)
	}
	if n < 30000 || held == n || held < n/2 {
		t.Errorf("%d rows, %d held by the old rule: want a corpus on both sides of it", n, held)
	}
	t.Logf("%d rows, %d held", n, held)
}
