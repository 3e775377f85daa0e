package effects_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
)

// partScope is a consumer's scope: its rows lie in the consumer's buckets.
var partScope = effects.ConsumerScope("c1", "http", "pay")

// placeRow leaves an unclaimed intent of key where says: "" (no row),
// "bucket" (an older bucket of c1's), "legacy" (the legacy partition, as a
// row of the table before migration 032) or "default" (the default
// partition: a time no bucket covers). c1's current buckets exist in every
// case, so a new row lands in the current bucket.
func placeRow(t *testing.T, db *testkit.DB, key, where string) {
	t.Helper()
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// 24h: buckets of 3 hours.
	exec(`SELECT onceflow.effects_ensure_buckets('inbox/c1/', 86400)`)
	const ins = `INSERT INTO %s (owner, scope, idempotency_key, event_id, status, attempts, created_at)
	             VALUES ($1, $2, $3, 'e-' || $3, 'intent', 1, now() - interval '2 days')`
	switch where {
	case "":
	case "bucket":
		exec(`SELECT onceflow.effects_ensure_buckets('inbox/c1/', 86400, now() - interval '2 days')`)
		exec(fmt.Sprintf(ins, "onceflow.effects"), "inbox/c1/", partScope, key)
	case "legacy":
		exec(fmt.Sprintf(ins, "onceflow.effects_legacy"), "", partScope, key)
	case "default":
		exec(fmt.Sprintf(ins, "onceflow.effects"), "inbox/c1/", partScope, key)
	default:
		t.Fatalf("placeRow %q", where)
	}
	if where == "" {
		return
	}
	var part string
	if err := db.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM onceflow.effects WHERE idempotency_key = $1`, key).Scan(&part); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"legacy": "onceflow.effects_legacy", "default": "onceflow.effects_default"}[where]
	if (want != "" && part != want) || (where == "bucket" && !strings.HasPrefix(part, "onceflow.effects_b_")) {
		t.Fatalf("row placed in %s, want %s", part, where)
	}
}

// waitBlocked waits until the backend pid waits for a lock, or done is
// closed (the statement it runs answered without waiting).
func waitBlocked(t *testing.T, db *testkit.DB, pid uint32, done <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			return
		default:
		}
		var waiting bool
		if err := db.Pool.QueryRow(context.Background(),
			`SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d never waited for a lock", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConcurrentInsertersOneRow: two inserters of one key on two
// connections, the first's transaction still open while the second runs,
// leave exactly one row whether the key had none or had one in an older
// bucket, in the legacy partition or in the default one, and the second
// answers as it did before the ledger was partitioned (busy, done,
// recorded). The partitions' unique key holds created_at, so without the
// key's advisory lock (a second new row) or the probe of every partition
// (a second row beside an older one) there would be two.
func TestConcurrentInsertersOneRow(t *testing.T) {
	t.Parallel()
	type step struct {
		q    string
		args func(key string) []any
	}
	leaseClaim := func(owner string) step {
		return step{`SELECT status FROM onceflow.effect_lease_claim($1, $2, 'e-' || $1, $3, interval '1 minute')`,
			func(key string) []any { return []any{key, partScope, owner} }}
	}
	record := step{`SELECT onceflow.effect_lease_record($1, $2, 201, '{"ok":true}', 'e-' || $1)::text`,
		func(key string) []any { return []any{key, partScope} }}
	many := step{`SELECT status FROM onceflow.effect_lease_claim_many(ARRAY[$1, 'other'], ARRAY[$2, $2], ARRAY['e-' || $1, 'e-other'],
	                 ARRAY['b', 'b'], ARRAY[interval '1 minute', interval '1 minute']) WHERE i = 1`,
		func(key string) []any { return []any{key, partScope} }}
	sessionClaim := step{`SELECT (onceflow.effect_claim($1, $2, 'e-' || $1)).status`,
		func(key string) []any { return []any{key, partScope} }}
	cases := []struct {
		name          string
		first, second step
		want          string // the second's answer
		status        string // the row's at the end
	}{
		{"lease claims", leaseClaim("a"), leaseClaim("b"), "busy", "intent"},
		{"record then group claim", record, many, "done", "done"},
		{"session claim then record", sessionClaim, record, "true", "done"},
	}
	for _, c := range cases {
		for _, where := range []string{"", "bucket", "legacy", "default"} {
			name := c.name + "/" + where
			if where == "" {
				name += "new"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				db := testkit.NewDBUnlessShort(t)
				ctx := context.Background()
				const key = "event:k1"
				placeRow(t, db, key, where)
				a, err := pgx.Connect(ctx, db.URL)
				if err != nil {
					t.Fatal(err)
				}
				defer a.Close(ctx)
				b, err := pgx.Connect(ctx, db.URL)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close(ctx)
				tx, err := a.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				var got string
				if err := tx.QueryRow(ctx, c.first.q, c.first.args(key)...).Scan(&got); err != nil {
					t.Fatalf("first: %v", err)
				}
				done := make(chan struct{})
				var (
					second    string
					secondErr error
				)
				go func() {
					defer close(done)
					secondErr = b.QueryRow(ctx, c.second.q, c.second.args(key)...).Scan(&second)
				}()
				// A lease claim does not wait for another (it answers busy
				// at once); the others wait for the first's commit.
				waitBlocked(t, db, b.PgConn().PID(), done)
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				<-done
				if secondErr != nil {
					t.Fatalf("second: %v", secondErr)
				}
				if second != c.want {
					t.Errorf("second answered %s, want %s", second, c.want)
				}
				var n int
				var status string
				if err := db.Pool.QueryRow(ctx, `SELECT count(*), min(status) FROM onceflow.effects WHERE scope = $1 AND idempotency_key = $2`,
					partScope, key).Scan(&n, &status); err != nil {
					t.Fatal(err)
				}
				if n != 1 || status != c.status {
					t.Errorf("%d rows of the key, status %s; want 1, %s", n, status, c.status)
				}
				// The session claim's lock ends with its connection.
				_, _ = a.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
			})
		}
	}
}

// TestNewKeyOnlyInReadCommitted: a new key is not recorded in a REPEATABLE
// READ transaction (its snapshot, taken before the key's lock was granted,
// could miss a row committed meanwhile); an existing key's row is claimed
// there as before.
func TestNewKeyOnlyInReadCommitted(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	placeRow(t, db, "event:old", "bucket")
	tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if c, err := effects.ClaimLease(ctx, tx, partScope, "event:old", "e-old", "a", time.Minute); err != nil || c.Status != effects.StatusClaimed {
		t.Fatalf("claim of an existing key in REPEATABLE READ: %+v, %v", c, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err = db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := effects.ClaimLease(ctx, tx, partScope, "event:new", "e-new", "a", time.Minute); err == nil {
		t.Fatal("a new key was claimed in REPEATABLE READ")
	}
}

// TestExpireBucketCatchesLateCommits: the rows to keep that appear after
// KeepBucketRows read the bucket (a done row whose inbox row committed
// since, an intent) are moved by ExpireBucket under its lock; a done row
// completed long before, whose inbox row is gone, goes with the bucket.
func TestExpireBucketCatchesLateCommits(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`SELECT onceflow.effects_ensure_buckets('inbox/c1/', 86400, now() - interval '3 days')`)
	ins := func(key, status, completed string) {
		t.Helper()
		exec(`INSERT INTO onceflow.effects (owner, scope, idempotency_key, event_id, status, attempts, completed_at, created_at)
		      VALUES ('inbox/c1/', $1, $2, 'e-' || $2, $3, 1, now() - $4::interval, now() - interval '3 days')`, partScope, key, status, completed)
	}
	ins("old-done", "done", "3 days")
	buckets, err := effects.Buckets(ctx, db.Pool, "c1")
	if err != nil || len(buckets) == 0 {
		t.Fatalf("buckets %v, %v", buckets, err)
	}
	b := buckets[0]
	if n, err := effects.KeepBucketRows(ctx, db.Pool, "c1", b); err != nil || n != 0 {
		t.Fatalf("first step: %d, %v; want nothing to keep", n, err)
	}
	// Meanwhile: an event's effect recorded with its inbox row, an intent.
	ins("late-done", "done", "1 second")
	ins("late-intent", "intent", "0 seconds")
	exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status)
	      VALUES ('c1', 'e-late-done', 'src', 'x', 't', 0, 0, 'processed')`)
	if n, err := effects.ExpireBucket(ctx, db.Pool, "c1", b); err != nil || n != 2 {
		t.Fatalf("second step moved %d, %v; want 2", n, err)
	}
	var kept string
	if err := db.Pool.QueryRow(ctx, `SELECT string_agg(idempotency_key, ',' ORDER BY idempotency_key) FROM onceflow.effects_legacy`).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if kept != "late-done,late-intent" {
		t.Errorf("kept %s, want late-done,late-intent", kept)
	}
}

// TestClaimsOfAnotherConsumerDoNotWaitForABucket: while retention holds one
// consumer's bucket (ACCESS EXCLUSIVE, as its expiry does), another
// consumer's claims go on, past the fifth call of a session too (the
// functions plan for their arguments; a cached generic plan would lock
// every partition of the ledger and wait).
func TestClaimsOfAnotherConsumerDoNotWaitForABucket(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.effects_ensure_buckets('inbox/c1/', 86400)`); err != nil {
		t.Fatal(err)
	}
	var bucket string
	if err := db.Pool.QueryRow(ctx, `SELECT relname FROM onceflow.effects_buckets WHERE owner = 'inbox/c1/' ORDER BY from_at LIMIT 1`).Scan(&bucket); err != nil {
		t.Fatal(err)
	}
	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `LOCK TABLE onceflow.`+pgx.Identifier{bucket}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET lock_timeout = '2s'`); err != nil {
		t.Fatal(err)
	}
	other := effects.ConsumerScope("c2", "http", "pay")
	for i := range 10 {
		key := fmt.Sprintf("event:o%d", i)
		if _, err := effects.ClaimLease(ctx, conn, other, key, "", "a", time.Minute); err != nil {
			t.Fatalf("claim %d of another consumer while c1's bucket is locked: %v", i, err)
		}
		if _, err := effects.RecordLease(ctx, conn, other, key, effects.Result{Code: 200}); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
}
