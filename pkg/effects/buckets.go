package effects

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// The ledger is partitioned by (owner, created_at) (migration 032,
// docs/effects.md "Storage layout"): the rows of a consumer's scopes (owner
// ConsumerScopePrefix) lie in time buckets its pruner makes ahead of time,
// and retention removes an expired bucket whole. The rows of every other
// scope, of the table before the migration and the rows retention keeps out
// of an expired bucket lie in the legacy partition; rows no bucket takes,
// in the default one. Both are pruned row by row (DeleteDone).

// Bucket is one time-bucket partition of a consumer's effects.
type Bucket struct {
	From, To  time.Time
	Truncated bool
}

// Width is the bucket's width.
func (b Bucket) Width() time.Duration { return b.To.Sub(b.From) }

const (
	qEnsureBuckets = `SELECT onceflow.effects_ensure_buckets($1, $2)`
	qBuckets       = `
SELECT from_at, to_at, truncated_at IS NOT NULL FROM onceflow.effects_buckets
 WHERE owner = $1 ORDER BY from_at`
	// qBucketRows is the planner's estimate of a bucket's rows once it was
	// analyzed (-1 before); a count would read the whole bucket.
	qBucketRows = `
SELECT c.reltuples::bigint FROM onceflow.effects_buckets b
  JOIN pg_class c ON c.relname = b.relname AND c.relnamespace = 'onceflow'::regnamespace
 WHERE b.owner = $1 AND b.from_at = $2`
	qCountBucket  = `SELECT count(*) FROM onceflow.effects WHERE owner = $1 AND created_at >= $2 AND created_at < $3`
	qKeepBucket   = `SELECT onceflow.effects_keep_bucket_rows($1, $2, $3)`
	qExpireBucket = `SELECT onceflow.effects_expire_bucket($1, $2, $3)`
	qDropBucket   = `SELECT onceflow.effects_drop_bucket($1, $2)`
)

// EnsureBuckets makes consumer's current and next effects buckets when
// missing (onceflow.effects_ensure_buckets), each an eighth of keep (the
// consumer's longest TTL) wide in whole hours, at least an hour; a
// consumer's buckets keep the width of its first. It waits at most 100 ms
// for each of its locks and then fails with SQLSTATE 55P03: the rows of a
// bucket not made go to the default partition, where they are still found
// and pruned row by row. It returns the end of the current bucket.
func EnsureBuckets(ctx context.Context, db dbtx.DB, consumer string, keep time.Duration) (time.Time, error) {
	var end time.Time
	if err := db.QueryRow(ctx, qEnsureBuckets, ConsumerScopePrefix(consumer), int64(keep/time.Second)).Scan(&end); err != nil {
		return time.Time{}, fmt.Errorf("ensure effects buckets: %w", err)
	}
	return end, nil
}

// Buckets lists consumer's effects buckets, oldest first.
func Buckets(ctx context.Context, db dbtx.DB, consumer string) ([]Bucket, error) {
	rows, err := db.Query(ctx, qBuckets, ConsumerScopePrefix(consumer))
	if err != nil {
		return nil, fmt.Errorf("effects buckets: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Bucket])
	if err != nil {
		return nil, fmt.Errorf("effects buckets: %w", err)
	}
	return out, nil
}

// BucketRows returns how many rows consumer's bucket holds: the planner's
// estimate once the bucket was analyzed, else an exact count.
func BucketRows(ctx context.Context, db dbtx.DB, consumer string, b Bucket) (int64, error) {
	owner := ConsumerScopePrefix(consumer)
	var n int64
	if err := db.QueryRow(ctx, qBucketRows, owner, b.From).Scan(&n); err != nil {
		return 0, fmt.Errorf("effects bucket size: %w", err)
	}
	if n >= 0 {
		return n, nil
	}
	if err := db.QueryRow(ctx, qCountBucket, owner, b.From, b.To).Scan(&n); err != nil {
		return 0, fmt.Errorf("count effects bucket: %w", err)
	}
	return n, nil
}

// KeepBucketRows moves the rows of consumer's expired bucket that
// retention keeps into the legacy partition, under row locks only
// (onceflow.effects_keep_bucket_rows): every row not done (an intent, a
// held effect), every row without an event id, and every done row whose
// event still has an inbox row of consumer. It reads the whole bucket and
// probes the inbox for each done row: run it before ExpireBucket, which
// then holds its lock only briefly. It returns how many rows it moved.
func KeepBucketRows(ctx context.Context, db dbtx.DB, consumer string, b Bucket) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, qKeepBucket, ConsumerScopePrefix(consumer), consumer, b.From).Scan(&n); err != nil {
		return 0, fmt.Errorf("keep rows of effects bucket %s: %w", b.From.UTC().Format(time.RFC3339), err)
	}
	return n, nil
}

// ExpireBucket locks consumer's bucket, moves into the legacy partition the
// rows to keep that KeepBucketRows could not see (rows not done or without
// an event; done rows completed since an hour before it ran whose event
// has an inbox row; every done row whose event has one when it did not
// run), and truncates the bucket (onceflow.effects_expire_bucket: waits at
// most 100 ms for its lock, then fails with SQLSTATE 55P03). It returns
// how many rows it moved.
func ExpireBucket(ctx context.Context, db dbtx.DB, consumer string, b Bucket) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, qExpireBucket, ConsumerScopePrefix(consumer), consumer, b.From).Scan(&n); err != nil {
		return 0, fmt.Errorf("expire effects bucket %s: %w", b.From.UTC().Format(time.RFC3339), err)
	}
	return n, nil
}

// DropBucket drops consumer's truncated bucket
// (onceflow.effects_drop_bucket: waits at most 100 ms for its lock on
// onceflow.effects, then fails with SQLSTATE 55P03).
func DropBucket(ctx context.Context, db dbtx.DB, consumer string, b Bucket) error {
	if _, err := db.Exec(ctx, qDropBucket, ConsumerScopePrefix(consumer), b.From); err != nil {
		return fmt.Errorf("drop effects bucket %s: %w", b.From.UTC().Format(time.RFC3339), err)
	}
	return nil
}
