package inbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// v7 writes a UUIDv7 of time t with random bits.
func v7(t time.Time) string {
	ms := uint64(t.UnixMilli())
	r := rand.Uint64()
	return fmt.Sprintf("%08x-%04x-7%03x-%x%03x-%012x", ms>>16, ms&0xffff, r&0xfff, 8+(r>>12)&3, (r>>14)&0xfff, (r>>26)&0xffffffffffff)
}

func TestEventIDTime(t *testing.T) {
	t.Parallel()
	at := time.UnixMilli(1_764_000_000_123)
	id := v7(at)
	if got, ok := eventIDTime(id); !ok || !got.Equal(at) {
		t.Fatalf("eventIDTime(%q) = %v, %v; want %v", id, got, ok, at)
	}
	if got, ok := eventIDTime("0192f3a4-5b6c-7d8e-9f01-23456789abcd"); !ok || got.UnixMilli() != 0x0192f3a45b6c {
		t.Fatalf("a fixed UUIDv7: %v, %v", got, ok)
	}
	for _, bad := range idsNotV7(id) {
		if got, ok := eventIDTime(bad); ok {
			t.Errorf("eventIDTime(%q) = %v, true; want false", bad, got)
		}
	}
}

// idsNotV7 are ids near the UUIDv7 id that are not one.
func idsNotV7(id string) []string {
	return []string{
		"", "e1", "order-88:refund_issued",
		strings.ToUpper(id),          // upper case
		id[:14] + "4" + id[15:],      // version 4
		id[:19] + "c" + id[20:],      // variant 110
		id[:35], id + "0", id + "\n", // length
		id[:8] + "_" + id[9:],                         // a group separator
		id[:3] + "g" + id[4:],                         // not hex
		id[:3] + "é" + id[5:],                         // not ASCII, same length in bytes
		"{" + id[1:35] + "}",                          // braces
		strings.ReplaceAll(id, "-", "")[:32] + "abcd", // no dashes
	}
}

// TestEventIDTimeAgreesWithTheConstraint: the Go rule and the constraint
// inbox_id_time agree on which ids are UUIDv7s and on their time. A row of a
// ttl lane at exactly the id's floor (its time less idTimeSkew) is accepted
// and a microsecond earlier refused, and an id that is not a UUIDv7 is
// accepted at any time: were they to disagree, the probe could skip the
// bucket holding a row.
func TestEventIDTimeAgreesWithTheConstraint(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	now := time.Now()
	ids := []string{"0192f3a4-5b6c-7d8e-9f01-23456789abcd", "ffffffff-ffff-7fff-bfff-ffffffffffff", "00000000-0000-7000-8000-000000000000"}
	for range 50 {
		ids = append(ids, v7(now.Add(time.Duration(rand.Int64N(int64(2000*time.Hour)))-1000*time.Hour)))
	}
	for _, id := range idsNotV7(ids[3]) {
		if id != "" { // an empty event id is refused anyway
			ids = append(ids, id)
		}
	}
	insert := func(id string, at time.Time) error {
		_, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at)
			VALUES ('c', $1, 's', 1, 't', 'topic', 0, 0, 'processed', 'ttl-2592000s', $2)`, id, at)
		return err
	}
	for _, id := range ids {
		floor, ok := eventIDTime(id)
		if !ok {
			floor = now.Add(-5000 * time.Hour)
		} else {
			floor = floor.Add(-idTimeSkew)
		}
		floor = floor.Truncate(time.Microsecond)
		if err := insert(id, floor); err != nil {
			t.Errorf("%q (UUIDv7 %v) at its floor %v: %v", id, ok, floor, err)
		}
		err := insert(id, floor.Add(-time.Microsecond))
		var pgErr *pgconn.PgError
		switch {
		case ok && !(errors.As(err, &pgErr) && pgErr.ConstraintName == "inbox_id_time"):
			t.Errorf("%q a microsecond before its floor: %v, want the constraint inbox_id_time to refuse it", id, err)
		case !ok && err != nil:
			t.Errorf("%q (not a UUIDv7) long ago: %v", id, err)
		}
	}
}

// TestProbeReadsBucketsFromTheIDTime: the probe of a UUIDv7 key reads the
// buckets of a lane from the id's time less idTimeSkew on, and also those
// before onceflow.inbox_id_time.since (rows written before the constraint);
// a key that is not a UUIDv7 reads every bucket.
func TestProbeReadsBucketsFromTheIDTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	consumer := s.app.cfg.ConsumerName
	const lane = "ttl-2592000s" // 90-hour buckets
	if _, err := s.db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox_lanes (consumer, event_type, lane) VALUES ($1, 't', $2)`, consumer, lane); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	bucketAt := map[string]time.Time{}
	for _, back := range []time.Duration{400 * time.Hour, 200 * time.Hour, 0} {
		if _, err := s.db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets($1, $2, $3)`, consumer, lane, now.Add(-back)); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := s.db.Pool.Query(ctx, `SELECT relname, from_at FROM onceflow.inbox_buckets WHERE consumer = $1 AND lane = $2`, consumer, lane)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		var from time.Time
		if err := rows.Scan(&name, &from); err != nil {
			t.Fatal(err)
		}
		bucketAt[name] = from
	}
	if rows.Err() != nil || len(bucketAt) < 4 {
		t.Fatalf("buckets %v: %v", bucketAt, rows.Err())
	}
	probe, err := s.app.lanes.probeLanes(ctx, s.db.Pool, consumer)
	if err != nil {
		t.Fatal(err)
	}
	// read returns the buckets of the lane the read-only probe of ids reads.
	read := func(ids []string) map[string]bool {
		t.Helper()
		s.app.lanes.since.Valid = false // read since again
		known, _ := probeStatements(t, s, probe)
		out := map[string]bool{}
		for rel := range testkit.ExplainAnalyze(t, s.db.Pool, known, consumer, ids, batchFloor(ids)).Relations() {
			if _, ok := bucketAt[rel]; ok {
				out[rel] = true
			}
		}
		return out
	}
	recent := v7(now.Add(-time.Minute))
	old := v7(now.Add(-190 * time.Hour))

	// Every row held to the constraint.
	if _, err := s.db.Pool.Exec(ctx, `UPDATE onceflow.inbox_id_time SET since = '-infinity'`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		ids  []string
		from time.Time // the earliest bucket end read
	}{
		{"a recent UUIDv7", []string{recent}, now.Add(-time.Minute - idTimeSkew)},
		{"a UUIDv7 of 190 hours ago", []string{old}, now.Add(-190*time.Hour - idTimeSkew)},
		{"an id that is not a UUIDv7", []string{"order-88"}, time.Time{}},
	} {
		got := read(c.ids)
		for name, from := range bucketAt {
			want := !from.Add(90 * time.Hour).Before(c.from)
			if got[name] != want {
				t.Errorf("%s: bucket from %v read %v, want %v (read: %v)", c.name, from, got[name], want, got)
			}
		}
	}
	// Rows written before the constraint: every bucket that begins before
	// since is read too.
	since := now.Add(-150 * time.Hour)
	if _, err := s.db.Pool.Exec(ctx, `UPDATE onceflow.inbox_id_time SET since = $1`, since); err != nil {
		t.Fatal(err)
	}
	got := read([]string{recent})
	for name, from := range bucketAt {
		want := from.Before(since) || !from.Add(90*time.Hour).Before(now.Add(-time.Minute-idTimeSkew))
		if got[name] != want {
			t.Errorf("since %v: bucket from %v read %v, want %v", since, from, got[name], want)
		}
	}
}

// TestTruncationDoesNotHoldUpNewUUIDv7s: retention truncates an expired
// bucket under an ACCESS EXCLUSIVE lock. A batch of new UUIDv7 ids is
// planned without the buckets that end before its floor (batchFloor), so
// it neither locks nor waits for that bucket; a batch with an id that is
// not a UUIDv7 probes every bucket and waits until the lock is released.
// The inbox's statements only: the PostgreSQL sequence guard reads the
// stream's parked rows in every partition of the inbox (qLoadParked), and
// waits for such a lock whatever the ids.
func TestTruncationDoesNotHoldUpNewUUIDv7s(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, &scriptedGuard{known: map[string]Event{}})
	consumer := s.app.cfg.ConsumerName
	const lane = "ttl-2592000s" // 90-hour buckets
	if _, err := s.db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox_lanes (consumer, event_type, lane) VALUES ($1, 't', $2)`, consumer, lane); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, back := range []time.Duration{400 * time.Hour, 0} {
		if _, err := s.db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets($1, $2, $3)`, consumer, lane, now.Add(-back)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.db.Pool.Exec(ctx, `UPDATE onceflow.inbox_id_time SET since = '-infinity'`); err != nil {
		t.Fatal(err)
	}
	s.app.lanes.since.Valid = false
	var old string
	if err := s.db.Pool.QueryRow(ctx, `SELECT relname FROM onceflow.inbox_buckets WHERE consumer = $1 AND lane = $2 ORDER BY from_at LIMIT 1`,
		consumer, lane).Scan(&old); err != nil {
		t.Fatal(err)
	}
	// Retention's lock on the old bucket, held until released.
	holder, err := s.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // released below or at the end
	if _, err := holder.Exec(ctx, `LOCK TABLE onceflow.`+pgx.Identifier{old}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	// New UUIDv7 ids: applied while the lock is held (the read-only probe
	// and the insert both).
	quick, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if known, err := s.app.allKnown(quick, items(ownRec(v7(now), 1), ownRec(v7(now), 2))); err != nil || known {
		t.Fatalf("read-only probe of new UUIDv7 ids under the bucket's lock: %v, %v; want unknown, no wait", known, err)
	}
	out, err := s.app.applyTx(quick, items(ownRec(v7(now), 1), ownRec(v7(now), 2)))
	if err != nil || out.processed != 2 {
		t.Fatalf("batch of new UUIDv7 ids under the bucket's lock: %+v, %v; want 2 processed, no wait", out, err)
	}
	// An id of the producer's own: the probe reads the old bucket, so the
	// batch waits for the lock.
	waitsFor(t, s.db.Pool, old, holder, "a batch with an id that is not a UUIDv7", func() error {
		_, err := s.app.applyTx(ctx, items(ownRec("order-88", 3)))
		return err
	})
}

// waitsFor runs f, which must wait for a lock on relation rel that holder
// holds: once f's wait shows in pg_locks, holder rolls back and f must
// then finish without error. f finishing before it waited fails the test
// (it could not tell).
func waitsFor(t *testing.T, pool *pgxpool.Pool, rel string, holder pgx.Tx, what string, f func() error) {
	t.Helper()
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- f() }()
	for waiting := false; !waiting; {
		select {
		case err := <-done:
			t.Fatalf("%s did not wait for the lock on %s (err %v): the test cannot tell", what, rel, err)
		case <-time.After(10 * time.Millisecond):
		}
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
			WHERE c.relname = $1 AND NOT l.granted)`, rel).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("%s, after the lock was released: %v", what, err)
	}
}

// ownRec is a record of event id, the first of a source of its own.
func ownRec(id string, offset int64) *kgo.Record {
	ev := envelope.Envelope{EventID: id, Source: "src-" + id, Seq: 1, EventType: "t", Payload: []byte(`{}`)}
	r := ev.Record("topic")
	r.Offset = offset
	return r
}

// TestIDAheadOfTheClockGoesToLegacy: an event whose UUIDv7 id was made more
// than idTimeSkew ahead of the database's clock is written to the legacy
// lane (the constraint would refuse it in its own lane), and its redelivery
// days later is still found there; a redelivery of an event first applied
// 190 hours ago, whose row lies in an old bucket, is found too.
func TestIDAheadOfTheClockGoesToLegacy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	consumer := s.app.cfg.ConsumerName
	const lane = "ttl-2592000s"
	if _, err := s.db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox_lanes (consumer, event_type, lane) VALUES ($1, 't', $2)`, consumer, lane); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := s.db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets($1, $2, $3)`, consumer, lane, now.Add(-190*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Pool.Exec(ctx, `UPDATE onceflow.inbox_id_time SET since = '-infinity'`); err != nil {
		t.Fatal(err)
	}
	ahead, old := v7(now.Add(48*time.Hour)), v7(now.Add(-190*time.Hour))
	if _, err := s.db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at)
		VALUES ($1, $2, 'old', 1, 't', 'topic', 0, 0, 'processed', $3, $4)`, consumer, old, lane, now.Add(-190*time.Hour+time.Minute)); err != nil {
		t.Fatal(err)
	}
	out, err := s.app.applyTx(ctx, items(ownRec(ahead, 1), ownRec("plain", 2)))
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 2 {
		t.Fatalf("first batch: %+v", out)
	}
	for id, want := range map[string]string{ahead: laneLegacy, "plain": lane} {
		var got string
		if err := s.db.Pool.QueryRow(ctx, `SELECT lane FROM onceflow.inbox WHERE consumer = $1 AND event_id = $2`, consumer, id).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s went to lane %s, want %s", id, got, want)
		}
	}
	// The redeliveries, one at a time in a transaction (not the read-only
	// path) and together through it.
	for _, id := range []string{ahead, old} {
		out, err := s.app.applyTx(ctx, items(ownRec(id, 3), ownRec(v7(now), 4)))
		if err != nil {
			t.Fatal(err)
		}
		if out.duplicates != 1 {
			t.Errorf("redelivery of %s beside a new event: %+v, want one duplicate", id, out)
		}
	}
	known, err := s.app.allKnown(ctx, items(ownRec(ahead, 5), ownRec(old, 6)))
	if err != nil || !known {
		t.Errorf("read-only probe of both: %v, %v; want known", known, err)
	}
	if n := len(s.rec.got); n != 4 {
		t.Errorf("the handler ran %d times, want 4 (two new events, two more new ones beside the redeliveries)", n)
	}
}
