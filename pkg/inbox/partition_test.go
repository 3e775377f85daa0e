package inbox

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/migrate"
)

// typedRec is an event record of a given type whose Kafka timestamp is ts.
func typedRec(id, typ string, seq, offset int64, ts time.Time) *kgo.Record {
	ev := envelope.Envelope{EventID: id, Source: "s-" + id, Seq: seq, EventType: typ, Payload: []byte(`{}`)}
	r := ev.Record("topic")
	r.Offset = offset
	r.Timestamp = ts
	return r
}

// inboxOnly is a guard that applies every new event: the sequence guard
// would also call some of these tests' redeliveries duplicates (their
// source's seq already applied); the tests judge the inbox alone.
func inboxOnly() *scriptedGuard { return &scriptedGuard{known: map[string]Event{}} }

func publish(t *testing.T, db *testkit.DB, consumer string, classes ...Class) {
	t.Helper()
	for i := range classes {
		classes[i].Pattern = GlobRegexp(classes[i].Glob)
	}
	if err := PublishClasses(context.Background(), db.Pool, consumer, classes); err != nil {
		t.Fatal(err)
	}
}

func applyOnce(t *testing.T, a *applier, recs ...*kgo.Record) outcome {
	t.Helper()
	out, err := a.applyTx(context.Background(), items(recs...))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// where returns the partition and lane of consumer c1's row of id.
func where(t *testing.T, db *testkit.DB, id string) string {
	t.Helper()
	var part, lane string
	err := db.Pool.QueryRow(context.Background(),
		`SELECT tableoid::regclass::text, lane FROM onceflow.inbox WHERE consumer = 'c1' AND event_id = $1`, id).Scan(&part, &lane)
	if err != nil {
		t.Fatalf("row of %s: %v", id, err)
	}
	return part + " " + lane
}

// ageRow moves id's row into lane's bucket of ago before now (made for the
// purpose), as if it had been inserted then.
func ageRow(t *testing.T, db *testkit.DB, id, lane string, ago time.Duration) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets('c1', $1, now() - $2::interval)`, lane, ago); err != nil {
		t.Fatal(err)
	}
	tag, err := db.Pool.Exec(ctx, `UPDATE onceflow.inbox SET event_at = now() - $2::interval, received_at = now() - $2::interval
	  WHERE consumer = 'c1' AND event_id = $1`, id, ago)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("age %s: %v (%d rows)", id, err, tag.RowsAffected())
	}
}

// TestRedeliveryInAnotherBucket: the copy of an event re-sent days later,
// with a record timestamp days later, while the first copy's row lies in an
// older time bucket of its lane (or in the legacy partition, or the
// default one), is a duplicate: the dedup probe covers every partition of
// the consumer, not only the bucket the copy would land in.
func TestRedeliveryInAnotherBucket(t *testing.T) {
	t.Parallel()
	s := setupApply(t, inboxOnly())
	publish(t, s.db, "c1", Class{Glob: "pay.*"}, Class{Glob: "*", Keep: 72 * time.Hour})
	now := time.Now()
	applyOnce(t, s.app, typedRec("e1", "ping.a", 1, 0, now), typedRec("p1", "pay.x", 1, 1, now))
	if got := where(t, s.db, "e1"); !strings.HasSuffix(got, " ttl-259200s") || !strings.HasPrefix(got, "onceflow.inbox_b_") {
		t.Fatalf("e1 is in %s, want a bucket of lane ttl-259200s", got)
	}
	if got := where(t, s.db, "p1"); !strings.HasSuffix(got, " permanent") {
		t.Fatalf("p1 is in %s, want the permanent lane", got)
	}
	// The first copy's row is two days old (two buckets of 9 h back and
	// more); the copy comes with a timestamp three days on.
	ageRow(t, s.db, "e1", "ttl-259200s", 48*time.Hour)
	later := now.Add(72 * time.Hour)
	out := applyOnce(t, s.app, typedRec("e1", "ping.a", 1, 2, later), typedRec("p1", "pay.x", 1, 3, later))
	if out.duplicates != 2 || out.processed != 0 {
		t.Fatalf("redelivery: %+v, want 2 duplicates", out)
	}
	// A row in the default partition (its bucket was not made in time) is
	// found too.
	if _, err := s.db.Pool.Exec(context.Background(), `INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at)
	  VALUES ('c1', 'd1', 's', 'ping.a', 'topic', 0, 9, 'processed', 'ttl-259200s', now() + interval '400 days')`); err != nil {
		t.Fatal(err)
	}
	if got := where(t, s.db, "d1"); !strings.HasPrefix(got, "onceflow.inbox_default ") {
		t.Fatalf("d1 is in %s, want the default partition", got)
	}
	out = applyOnce(t, s.app, typedRec("d1", "ping.a", 1, 4, later))
	if out.duplicates != 1 {
		t.Fatalf("redelivery of a default-partition row: %+v, want a duplicate", out)
	}
	if len(s.rec.got) != 2 {
		t.Fatalf("handler saw %d events, want 2 (e1 and p1 once)", len(s.rec.got))
	}
	// The read-only fast path for a batch of redeliveries agrees.
	all, err := s.app.allKnown(context.Background(), items(typedRec("e1", "ping.a", 1, 5, later), typedRec("p1", "pay.x", 1, 6, later)))
	if err != nil || !all {
		t.Fatalf("allKnown = %v, %v; want true", all, err)
	}
}

// TestLaneSticksAcrossPolicyChange: a type's lane is recorded once; after
// the policy moves the type to another class, its events still go to the
// first lane and a redelivery of an event stored before the change is a
// duplicate. A type met before any policy was published writes to the
// legacy partition, and keeps its duplicates there once it gets a lane.
func TestLaneSticksAcrossPolicyChange(t *testing.T) {
	t.Parallel()
	s := setupApply(t, inboxOnly())
	now := time.Now()
	applyOnce(t, s.app, typedRec("early", "order.placed", 1, 0, now))
	if got := where(t, s.db, "early"); got != "onceflow.inbox_legacy legacy" {
		t.Fatalf("a type met before any policy: row in %s, want the legacy partition", got)
	}
	publish(t, s.db, "c1", Class{Glob: "order.*", Keep: time.Hour})
	s.app.lanes = laneBook{} // the legacy answer is otherwise kept a minute
	applyOnce(t, s.app, typedRec("o1", "order.placed", 1, 1, now))
	if got := where(t, s.db, "o1"); !strings.HasSuffix(got, " ttl-3600s") {
		t.Fatalf("o1 in %s, want lane ttl-3600s", got)
	}
	// The policy changes: order.* becomes permanent.
	publish(t, s.db, "c1", Class{Glob: "order.*"})
	other := &applier{cfg: s.app.cfg, handler: s.rec, guard: inboxOnly()} // a fresh process: nothing cached
	out := applyOnce(t, other, typedRec("o1", "order.placed", 1, 2, now.Add(time.Hour)), typedRec("early", "order.placed", 1, 3, now),
		typedRec("o2", "order.placed", 1, 4, now))
	if out.duplicates != 2 || out.processed != 1 {
		t.Fatalf("after the policy change: %+v, want o1 and early duplicates, o2 processed", out)
	}
	if got := where(t, s.db, "o2"); !strings.HasSuffix(got, " ttl-3600s") {
		t.Fatalf("o2 in %s: the type's lane moved", got)
	}
	if len(s.rec.got) != 3 {
		t.Fatalf("handler saw %d events, want 3", len(s.rec.got))
	}
}

// TestConcurrentCopiesInDifferentPartitions: two consumer processes apply
// the same event at once, one into the legacy partition (it met the type
// before the policy was published and still answers from its cache) and one
// into a time bucket. The second waits for the first's transaction on the
// key's lock, then finds its row: the event is applied once. Without the
// lock both inserts succeed in different partitions.
func TestConcurrentCopiesInDifferentPartitions(t *testing.T) {
	t.Parallel()
	s := setupApply(t, nil)
	ctx := context.Background()
	now := time.Now()
	// Process 1 learns "no lane yet" for the type.
	applyOnce(t, s.app, typedRec("warm", "order.placed", 1, 0, now))
	publish(t, s.db, "c1", Class{Glob: "*", Keep: time.Hour})

	arrived, release := make(chan struct{}), make(chan struct{})
	cfg1 := *s.app.cfg
	cfg1.Hooks.OnAfterHandler = func() { close(arrived); <-release }
	p1 := &applier{cfg: &cfg1, handler: s.rec, guard: inboxOnly()}
	// Copy the warm cache: p1 still writes order.placed to legacy.
	p1.lanes.byType, p1.lanes.legacyUntil, p1.lanes.bucketEnd = map[string]string{}, map[string]time.Time{"order.placed": now.Add(time.Hour)}, map[string]time.Time{}
	r2 := &recorder{}
	p2 := &applier{cfg: s.app.cfg, handler: r2, guard: inboxOnly()}

	// p2 has met the type (and made its bucket) before: while p1's
	// transaction is open, p2 waits only where the insert path makes it.
	if out := applyOnce(t, p2, typedRec("warm2", "order.placed", 1, 0, now)); out.processed != 1 {
		t.Fatalf("warm2: %+v", out)
	}
	var out1 outcome
	var err1 error
	done1 := make(chan struct{})
	go func() {
		defer close(done1)
		out1, err1 = p1.applyTx(ctx, items(typedRec("x", "order.placed", 1, 1, now)))
	}()
	<-arrived // p1 inserted x into the legacy partition and has not committed
	var out2 outcome
	var err2 error
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		out2, err2 = p2.applyTx(ctx, items(typedRec("x", "order.placed", 1, 1, now)))
	}()
	// p2 either waits for one of p1's locks (its key's; without that, the
	// row of the partition's stored offset, which comes too late: p2's
	// probe has its snapshot by then) or finishes.
	for waiting := false; !waiting; {
		select {
		case <-done2:
			waiting = true
		default:
			var n int
			if err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			  WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			waiting = n > 0
			if !waiting {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	close(release)
	<-done1
	<-done2
	if err1 != nil || err2 != nil {
		t.Fatalf("apply: %v, %v", err1, err2)
	}
	applied := out1.processed + out2.processed
	if applied != 1 {
		t.Fatalf("x applied %d times (p1 %+v, p2 %+v), want once", applied, out1, out2)
	}
	var rows int
	if err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.inbox WHERE consumer = 'c1' AND event_id = 'x'`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("x has %d inbox rows (%v), want 1", rows, err)
	}
}

// TestMigrationKeepsDedupRows: an inbox in the layout before migration 028,
// with processed, parked, dead and held rows, is migrated; redelivering
// every event afterwards applies none of them again, and new events land
// in their lanes.
func TestMigrationKeepsDedupRows(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := migrate.To(ctx, conn.Conn(), 27); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	if _, err := conn.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, received_at)
	  SELECT 'c1', 'old-' || g, 's-old-' || g, CASE WHEN g % 2 = 0 THEN 'ping.a' ELSE 'pay.x' END, 'topic', 0, g,
	         (ARRAY['processed', 'parked', 'dead', 'held'])[1 + g % 4], now() - g * interval '1 min'
	  FROM generate_series(1, $1) g`, n); err != nil {
		t.Fatal(err)
	}
	if _, _, err := migrate.Up(ctx, conn.Conn()); err != nil {
		t.Fatal(err)
	}
	conn.Release()
	var kind string
	if err := db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = 'onceflow.inbox'::regclass`).Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("onceflow.inbox relkind %q (%v), want partitioned", kind, err)
	}
	r := &recorder{}
	cfg := Config{Pool: db.Pool, Group: "g", ConsumerName: "c1"}.WithDefaults()
	a := &applier{cfg: &cfg, handler: r, guard: inboxOnly()}
	publish(t, db, "c1", Class{Glob: "pay.*"}, Class{Glob: "*", Keep: time.Hour})
	var recs []*kgo.Record
	for g := 1; g <= n; g++ {
		typ := "pay.x"
		if g%2 == 0 {
			typ = "ping.a"
		}
		recs = append(recs, typedRec(fmt.Sprintf("old-%d", g), typ, 1, int64(g), time.Now()))
		if len(recs) == 500 || g == n {
			out := applyOnce(t, a, recs...)
			if out.processed != 0 || out.duplicates != len(recs) {
				t.Fatalf("redelivery after the migration: %+v, want %d duplicates", out, len(recs))
			}
			recs = nil
		}
	}
	out := applyOnce(t, a, typedRec("new-1", "ping.a", 1, 0, time.Now()))
	if out.processed != 1 || len(r.got) != 1 {
		t.Fatalf("a new event after the migration: %+v", out)
	}
	if got := where(t, db, "new-1"); !strings.HasSuffix(got, " ttl-3600s") {
		t.Fatalf("new-1 in %s", got)
	}
	var legacy int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.inbox_legacy`).Scan(&legacy); err != nil || legacy != n {
		t.Fatalf("legacy partition has %d rows (%v), want %d", legacy, err, n)
	}
}

// TestEnsureBucketsPastDefaultRows: when the default partition already has
// rows of a lane's current range (the bucket was missing when they were
// inserted), that bucket cannot be made, but the next one still is: the
// next range's rows go to their own bucket, not to the default partition
// after them (migration 033; before, the call ended at the current bucket).
func TestEnsureBucketsPastDefaultRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.NewDB(t)
	const lane = "ttl-86400s"
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, lane)
VALUES ('c1', 'early', 's', 1, 't', 'topic', 0, 1, 'processed', $1)`, lane); err != nil {
		t.Fatal(err)
	}
	if part := where(t, db, "early"); part != "onceflow.inbox_default "+lane {
		t.Fatalf("row before any bucket: %s, want the default partition", part)
	}
	var end time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT onceflow.inbox_ensure_buckets('c1', $1)`, lane).Scan(&end); err != nil {
		t.Fatal(err)
	}
	var current, next bool
	if err := db.Pool.QueryRow(ctx, `
SELECT EXISTS (SELECT 1 FROM onceflow.inbox_buckets WHERE consumer = 'c1' AND lane = $1 AND to_at = $2),
       EXISTS (SELECT 1 FROM onceflow.inbox_buckets WHERE consumer = 'c1' AND lane = $1 AND from_at = $2)`, lane, end).Scan(&current, &next); err != nil {
		t.Fatal(err)
	}
	if current {
		t.Fatal("the current bucket was made although the default partition has rows of its range")
	}
	if !next {
		t.Fatalf("no next bucket (from %s) after the current one could not be made", end)
	}
	// A row of the next range lands in its bucket.
	if _, err := db.Pool.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at)
VALUES ('c1', 'later', 's', 2, 't', 'topic', 0, 2, 'processed', $1, $2::timestamptz + interval '1 second')`, lane, end); err != nil {
		t.Fatal(err)
	}
	if part := where(t, db, "later"); strings.Contains(part, "inbox_default") {
		t.Fatalf("row of the next range: %s, want its bucket", part)
	}
}
