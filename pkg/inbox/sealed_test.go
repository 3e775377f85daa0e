package inbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestKeyFilter: every id added is reported, about one in a hundred others
// is, and the stored form reads back the same.
func TestKeyFilter(t *testing.T) {
	t.Parallel()
	const n = 200_000
	f := newKeyFilter(n)
	for i := range n {
		f.add(keyHash(fmt.Sprintf("order-%d:refund_issued", i)))
	}
	g, err := unmarshalKeyFilter(f.marshal())
	if err != nil {
		t.Fatal(err)
	}
	for _, ff := range []*keyFilter{f, g} {
		for i := range n {
			if !ff.mayHave(keyHash(fmt.Sprintf("order-%d:refund_issued", i))) {
				t.Fatalf("order-%d:refund_issued was added but is not reported", i)
			}
		}
	}
	false_ := 0
	for i := range n {
		if g.mayHave(keyHash(fmt.Sprintf("order-%d:refund_denied", i))) {
			false_++
		}
	}
	if rate := float64(false_) / n; rate > 0.02 {
		t.Errorf("false positives %.4f of ids never added, want about 0.01", rate)
	} else {
		t.Logf("false positives: %.4f", rate)
	}
	if newKeyFilter(0).mayHave(keyHash("x")) {
		t.Error("an empty filter reports an id")
	}
	if e, err := unmarshalKeyFilter(newKeyFilter(0).marshal()); err != nil || e.mayHave(keyHash("x")) {
		t.Errorf("empty filter read back: %v", err)
	}
	bad := f.marshal()
	bad[4] = 9
	if _, err := unmarshalKeyFilter(bad); err == nil {
		t.Error("a filter of an unknown version was read")
	}
	if _, err := unmarshalKeyFilter([]byte("OFKF")); err == nil {
		t.Error("a truncated filter was read")
	}
	if _, err := unmarshalKeyFilter(f.marshal()[:100]); err == nil {
		t.Error("a filter shorter than its block count was read")
	}
}

// sealedSetup is a consumer with a 24h lane (3-hour buckets) whose buckets
// of 24 and 12 hours ago hold rows of ids of the producer's own (and a few
// UUIDv7s), as if applied then.
type sealedSetup struct {
	applySetup
	lane string
	old  []string // the own ids in the old buckets
}

func setupSealed(t *testing.T, perBucket int) sealedSetup {
	t.Helper()
	ctx := context.Background()
	s := sealedSetup{applySetup: setupApply(t, inboxOnly()), lane: "ttl-86400s"}
	consumer := s.app.cfg.ConsumerName
	if _, err := s.db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox_lanes (consumer, event_type, lane) VALUES ($1, 't', $2)`, consumer, s.lane); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, back := range []time.Duration{24 * time.Hour, 12 * time.Hour, 0} {
		if _, err := s.db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets($1, $2, $3)`, consumer, s.lane, now.Add(-back)); err != nil {
			t.Fatal(err)
		}
		if back == 0 {
			continue
		}
		if _, err := s.db.Pool.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, lane, event_at, received_at)
SELECT $1, 'own-' || $3::text || '-' || g, 'old', g, 't', 'topic', 0, g, 'processed', now(), $2, $4, $4
  FROM generate_series(1, $5::int) g`, consumer, s.lane, back.String(), now.Add(-back), perBucket); err != nil {
			t.Fatal(err)
		}
		for g := 1; g <= perBucket; g++ {
			s.old = append(s.old, fmt.Sprintf("own-%s-%d", back, g))
		}
		for i := range 5 {
			if _, err := s.db.Pool.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, lane, event_at, received_at)
VALUES ($1, $2, 'old-v7', $3, 't', 'topic', 0, $3, 'processed', now(), $4, $5, $5)`, consumer, v7(now.Add(-back)), i+1, s.lane, now.Add(-back)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return s
}

// seal seals and filters every sealable bucket, as retention's pass does,
// and makes the applier read the sealed set at its next batch.
func (s sealedSetup) seal(t *testing.T) (buckets []Bucket, keys int) {
	t.Helper()
	ctx := context.Background()
	consumer := s.app.cfg.ConsumerName
	buckets, err := SealableBuckets(ctx, s.db.Pool, consumer)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range buckets {
		if err := SealBucket(ctx, s.db.Pool, consumer, b); err != nil {
			t.Fatal(err)
		}
		// Pages of 1,000 ids: a bucket of setupSealed's 3,000 is read in
		// four statements, as a large one is.
		n, err := buildFilter(ctx, s.db.Pool, consumer, b, 1000)
		if err != nil {
			t.Fatal(err)
		}
		keys += n
	}
	s.app.lanes.mu.Lock()
	s.app.lanes.setAt = time.Time{}
	s.app.lanes.mu.Unlock()
	return buckets, keys
}

// TestSealedBucketsFindEveryDuplicate: once retention sealed the old
// buckets and stored their filters, every id in them is still a duplicate
// when redelivered (no filter may miss one), new ids of the producer's own
// are applied, and their look-up leaves the sealed buckets out of its plan.
// A row can no longer be inserted into a sealed bucket.
func TestSealedBucketsFindEveryDuplicate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupSealed(t, 3000)
	consumer := s.app.cfg.ConsumerName
	buckets, keys := s.seal(t)
	// 24h and 12h ago, each with the bucket after it (made with it).
	if len(buckets) != 4 {
		t.Fatalf("sealable buckets %+v, want the four past ones", buckets)
	}
	if keys != len(s.old) {
		t.Fatalf("filters hold %d ids, want the %d ids that are not UUIDv7s", keys, len(s.old))
	}
	if again, err := SealableBuckets(ctx, s.db.Pool, consumer); err != nil || len(again) != 0 {
		t.Fatalf("sealable after the pass: %v, %v; want none", again, err)
	}
	if err := SealBucket(ctx, s.db.Pool, consumer, buckets[0]); err != nil {
		t.Fatalf("sealing a sealed bucket again: %v", err)
	}

	// No row goes into a sealed bucket any more, whoever writes it.
	_, err := s.db.Pool.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at)
VALUES ($1, 'late-writer', 'x', 1, 't', 'topic', 0, 1, 'processed', $2, now() - interval '24 hours')`, consumer, s.lane)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" || !isRetryableDB(err) {
		t.Fatalf("insert into a sealed bucket: %v; want SQLSTATE 40001 (retried by the consumer)", err)
	}

	// Every old id, redelivered in batches of 500 among new ones: none is
	// applied again.
	offset := int64(0)
	var recs []*kgo.Record
	for i, id := range s.old {
		offset++
		recs = append(recs, ownRec(id, offset))
		if i%30 == 0 {
			offset++
			recs = append(recs, ownRec(fmt.Sprintf("new-%d", i), offset))
		}
	}
	newIDs := 0
	for i := 0; i < len(recs); i += 500 {
		batch := recs[i:min(i+500, len(recs))]
		out := applyOnce(t, s.app, batch...)
		want := 0
		for _, r := range batch {
			if isNewID(r) {
				want++
			}
		}
		newIDs += want
		if out.processed != want {
			t.Fatalf("batch at %d: %d applied, want %d (the new ids only): an old id's duplicate was applied", i, out.processed, want)
		}
	}
	if n := len(s.app.lanes.sealedSet()[s.lane]); n != 4 {
		t.Fatalf("the applier knows %d sealed buckets, want 4", n)
	}

	// The split and the plan: the new ids are clean (a few are not, the
	// filters' false positives), and their look-up reads no sealed bucket.
	fresh := make([]string, 500)
	for i := range fresh {
		fresh[i] = fmt.Sprintf("fresh-%d", i)
	}
	probe, err := s.app.lanes.probeLanes(ctx, s.db.Pool, consumer)
	if err != nil {
		t.Fatal(err)
	}
	sealed := s.app.lanes.sealedSet()
	dirty, clean := sealed.split(append(fresh, s.old[:10]...), probe)
	if len(dirty) < 10 || len(dirty) > 10+25 || len(clean) < 475 {
		t.Fatalf("split: %d dirty (want the 10 old ids and a few false positives), %d clean", len(dirty), len(clean))
	}
	since, err := s.app.lanes.idTimeSince(ctx, s.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	q, err := insertStatement(probe, since, sealed, false, true)
	if err != nil {
		t.Fatal(err)
	}
	n := len(clean)
	strs := func(v string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
	seqs := make([]int64, n)
	for i := range seqs {
		seqs[i] = int64(i + 1)
	}
	read := testkit.ExplainAnalyze(t, s.db.Pool, q, consumer, "topic", int32(0), clean, strs("s"), seqs, strs("t"), seqs,
		"g", int64(n+1), nil, strs(""), strs(s.lane), idFloors(clean), batchFloor(nil), []string{}, clean).Relations()
	rows, err := s.db.Pool.Query(ctx, `SELECT relname FROM onceflow.inbox_buckets WHERE consumer = $1 AND sealed_at IS NOT NULL`, consumer)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) != 4 {
		t.Fatalf("sealed buckets: %v, %v", names, err)
	}
	for _, rel := range names {
		if read[rel] {
			t.Errorf("the look-up of clean ids read sealed bucket %s (read: %v)", rel, read)
		}
	}
	if newIDs == 0 {
		t.Fatal("no new id was offered")
	}
}

// isNewID tells the records of new ids of TestSealedBucketsFindEveryDuplicate.
func isNewID(r *kgo.Record) bool {
	it := items(r)[0]
	return len(it.ev.EventID) > 4 && it.ev.EventID[:4] == "new-"
}

// TestSealWaitsForTheBucketsWriters: a transaction that wrote a row into a
// bucket and has not committed holds the seal off (the seal gives up after
// 100 ms, SQLSTATE 55P03, and a later pass tries again); once it
// committed, the seal and the filter include its row, so its redelivery is
// a duplicate.
func TestSealWaitsForTheBucketsWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupSealed(t, 10)
	consumer := s.app.cfg.ConsumerName
	writer, err := s.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := writer.Exec(ctx, `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, lane, event_at)
VALUES ($1, 'slow-writer', 'x', 1, 't', 'topic', 0, 1, 'processed', now(), $2, now() - interval '24 hours')`, consumer, s.lane); err != nil {
		t.Fatal(err)
	}
	buckets, err := SealableBuckets(ctx, s.db.Pool, consumer)
	if err != nil || len(buckets) == 0 {
		t.Fatalf("sealable: %v, %v", buckets, err)
	}
	err = SealBucket(ctx, s.db.Pool, consumer, buckets[0])
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("seal while a writer holds the bucket: %v; want a lock timeout (55P03)", err)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	s.seal(t)
	if out := applyOnce(t, s.app, ownRec("slow-writer", 1)); out.processed != 0 {
		t.Fatalf("redelivery of the row written just before the seal: %d applied, want 0", out.processed)
	}
}

// TestSealRefusesABucketNotPast: a bucket that ended less than SealMargin
// ago (or has not ended) is not sealed, and a filter is stored only for a
// sealed bucket.
func TestSealRefusesABucketNotPast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupSealed(t, 1)
	consumer := s.app.cfg.ConsumerName
	var cur Bucket
	if err := s.db.Pool.QueryRow(ctx, `SELECT lane, from_at, to_at, false FROM onceflow.inbox_buckets
	  WHERE consumer = $1 AND from_at <= now() AND to_at > now()`, consumer).Scan(&cur.Lane, &cur.From, &cur.To, &cur.Truncated); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if err := SealBucket(ctx, s.db.Pool, consumer, cur); !errors.As(err, &pgErr) || pgErr.Code != "22023" {
		t.Fatalf("seal of the current bucket: %v; want SQLSTATE 22023", err)
	}
	if _, err := BuildFilter(ctx, s.db.Pool, consumer, cur); !errors.As(err, &pgErr) || pgErr.Code != "55000" {
		t.Fatalf("filter of a bucket not sealed: %v; want SQLSTATE 55000", err)
	}
}

// TestSealedSetReadDoesNotHoldUpOtherBatches: while one partition's batch
// reads the sealed set (here held up by a lock on the filters' table, as a
// first read of 110 MB of filters holds it up for a second), another
// partition's batch goes on with the set read before; the reader then
// finishes and the applier knows the sealed buckets.
func TestSealedSetReadDoesNotHoldUpOtherBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupSealed(t, 10)
	s.seal(t) // and the next batch reads the sealed set again
	blocker, err := s.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx) //nolint:errcheck // rolled back below
	if _, err := blocker.Exec(ctx, `LOCK TABLE onceflow.inbox_filters IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	var out1 outcome
	var err1 error
	done1 := make(chan struct{})
	go func() {
		defer close(done1)
		out1, err1 = s.app.applyTx(ctx, items(ownRec("reader-batch", 1)))
	}()
	// The first batch waits for the lock, reading the sealed set.
	if !waitForLockWait(t, s.db.Pool, "%inbox_filters%") {
		t.Fatal("the first batch never read the sealed set")
	}
	var out2 outcome
	var err2 error
	done2 := make(chan struct{})
	go func() {
		defer close(done2)
		out2, err2 = s.app.applyTx(ctx, items(ownRec("other-partition", 1)))
	}()
	select {
	case <-done2:
	case <-time.After(20 * time.Second):
		_ = blocker.Rollback(ctx)
		<-done1
		<-done2
		t.Fatal("a batch waited for another batch's read of the sealed set")
	}
	if err2 != nil || out2.processed != 1 {
		t.Fatalf("the other batch: %+v, %v; want it applied", out2, err2)
	}
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	<-done1
	if err1 != nil || out1.processed != 1 {
		t.Fatalf("the reading batch: %+v, %v; want it applied", out1, err1)
	}
	if n := len(s.app.lanes.sealedSet()[s.lane]); n != 4 {
		t.Fatalf("the applier knows %d sealed buckets, want 4", n)
	}
}

// TestInsertWaitingForTheSealIsRefused: an insert into a bucket that
// reaches it while the seal's transaction holds the bucket's lock waits,
// and once the seal commits it is refused (SQLSTATE 40001), not let in
// behind the filter's back: the trigger is seen by a statement that was
// prepared, and its plan cached, before the seal.
func TestInsertWaitingForTheSealIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupSealed(t, 1)
	consumer := s.app.cfg.ConsumerName
	buckets, err := SealableBuckets(ctx, s.db.Pool, consumer)
	if err != nil || len(buckets) == 0 {
		t.Fatalf("sealable: %v, %v", buckets, err)
	}
	b := buckets[0]
	writer, err := s.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Release()
	const insert = `
INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, lane, event_at)
VALUES ($1, $2, 'x', 1, 't', 'topic', 0, 1, 'processed', now(), $3, $4)`
	at := b.From.Add(time.Minute)
	// Six runs: PostgreSQL's plan cache switches a prepared statement to
	// its generic plan after five.
	for i := range 6 {
		if _, err := writer.Exec(ctx, insert, consumer, fmt.Sprintf("before-seal-%d", i), b.Lane, at); err != nil {
			t.Fatal(err)
		}
	}
	seal, err := s.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer seal.Rollback(ctx) //nolint:errcheck // committed below
	if _, err := seal.Exec(ctx, `SELECT onceflow.inbox_seal_bucket($1, $2, $3)`, consumer, b.Lane, b.From); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := writer.Exec(ctx, insert, consumer, "during-seal", b.Lane, at)
		done <- err
	}()
	if !waitForLockWait(t, s.db.Pool, "%INSERT INTO onceflow.inbox%") {
		_ = seal.Rollback(ctx)
		t.Fatalf("the insert never waited for the seal's lock (it returned %v)", <-done)
	}
	if err := seal.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("the insert that waited for the seal: %v; want SQLSTATE 40001", err)
	}
	var n int
	if err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND event_id = 'during-seal'`, consumer).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows of the refused insert: %d (%v), want 0", n, err)
	}
}

// TestSealedFilterBudget: with SealedFilterMaxBytes below the sum of the
// filters, the consumer keeps the smallest that fit and probes the other
// sealed bucket as if it were not sealed: every old id is still a
// duplicate, and the stats say what was left out.
func TestSealedFilterBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupSealed(t, 3000)
	consumer := s.app.cfg.ConsumerName
	s.seal(t)
	rows, err := s.db.Pool.Query(ctx, `SELECT octet_length(filter)::bigint FROM onceflow.inbox_filters WHERE consumer = $1 ORDER BY 1`, consumer)
	if err != nil {
		t.Fatal(err)
	}
	sizes, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(sizes) != 4 || sizes[2] < 1000 {
		t.Fatalf("filter sizes %v (%v): want two empty and two of 3,000 ids", sizes, err)
	}
	// Room for every filter but the largest.
	s.app.cfg.SealedFilterMaxBytes = int(sizes[0] + sizes[1] + sizes[2] + sizes[3]/2)
	offset := int64(0)
	for i := 0; i < len(s.old); i += 500 {
		var recs []*kgo.Record
		for _, id := range s.old[i:min(i+500, len(s.old))] {
			offset++
			recs = append(recs, ownRec(id, offset))
		}
		if out := applyOnce(t, s.app, recs...); out.processed != 0 {
			t.Fatalf("batch at %d: %d applied, want 0: an old id's duplicate was applied", i, out.processed)
		}
	}
	st := s.app.lanes.loadedSealed()
	if st.unloaded != 1 || st.bytes != sizes[0]+sizes[1]+sizes[2] {
		t.Fatalf("sealed set holds %d bytes, %d buckets unloaded; want %d bytes, 1 unloaded", st.bytes, st.unloaded, sizes[0]+sizes[1]+sizes[2])
	}
	if n := len(s.app.lanes.sealedSet()[s.lane]); n != 3 {
		t.Fatalf("the applier knows %d sealed buckets, want the 3 whose filters fit", n)
	}
	if out := applyOnce(t, s.app, ownRec("new-after-budget", offset+1)); out.processed != 1 {
		t.Fatalf("a new id: %d applied, want 1", out.processed)
	}
}

// waitForLockWait waits until a session of the test database running a
// statement LIKE like waits for a lock, and reports whether one did within
// 30 s.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, like string) bool {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		  WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, like).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return true
		}
	}
	return false
}
