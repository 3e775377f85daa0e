package retention

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// inboxClasses is the policy's classes as the inbox records them
// (inbox.PublishClasses).
func (r *Policy) inboxClasses() []inbox.Class {
	out := make([]inbox.Class, len(r.Classes))
	for i, c := range r.Classes {
		out[i] = inbox.Class{Glob: c.Match, Pattern: inbox.GlobRegexp(c.Match), Keep: c.ttl}
	}
	return out
}

// laneTTL is how long the rows of a lane are kept under the policy: the
// longest TTL of the types recorded in it (a type recorded under one class
// and moved to a longer or permanent one since keeps its rows that long),
// 0 when one of them is now permanent or the lane has no type.
func (r *Policy) laneTTL(types []string) time.Duration {
	var ttl time.Duration
	for _, t := range types {
		d := r.ttlOf(t)
		if d == 0 {
			return 0
		}
		ttl = max(ttl, d)
	}
	return ttl
}

// Lock waits of a bucket's truncation and drop: each try waits at most
// 100 ms for its lock (the functions' lock_timeout), then backs off.
const (
	bucketTries      = 8
	bucketBackoffMin = 50 * time.Millisecond
	bucketBackoffMax = 2 * time.Second
)

// pruneBuckets removes consumer's expired time buckets: for each, the done
// effects of its processed events are deleted from the effects partitions
// pruned row by row (legacy, default; the effects buckets go whole, see
// pruneEffectBuckets), its parked, held, dead and
// late rows move to the legacy partition, it is truncated, then dropped.
// A bucket whose lock was not had in bucketTries tries is left for the next
// pass (a truncated one is only dropped then).
func pruneBuckets(ctx context.Context, conn *pgxpool.Conn, p *pass, consumer string, st *Stats) error {
	buckets, err := inbox.Buckets(ctx, conn, consumer)
	if err != nil {
		return err
	}
	if len(buckets) == 0 {
		return nil
	}
	types, err := inbox.LaneTypes(ctx, conn, consumer)
	if err != nil {
		return err
	}
	scopePrefix := effects.ConsumerScopePrefix(consumer)
	for _, b := range buckets {
		ttl := p.policy.laneTTL(types[b.Lane])
		if ttl == 0 || b.To.After(p.now.Add(-ttl)) {
			continue
		}
		var rows int64 // the bucket's rows before its expiry
		if !b.Truncated {
			n, err := inbox.BucketRows(ctx, conn, consumer, b)
			if err != nil {
				return err
			}
			e, err := effects.DeleteDoneOfInboxBucket(ctx, conn, scopePrefix, consumer, b.Lane, b.From, b.To)
			st.Effects += e
			if err != nil {
				return err
			}
			rows = n
		}
		expired, moved, err := expireAndDrop(ctx, st, b.Truncated,
			func() (int64, error) { return inbox.ExpireBucket(ctx, conn, consumer, b) },
			func() error { return inbox.DropBucket(ctx, conn, consumer, b) })
		if expired {
			st.Inbox += max(0, rows-moved)
			st.InboxBuckets++
		}
		if err != nil {
			return err
		}
	}
	return sealBuckets(ctx, conn, consumer, st)
}

// sealBuckets seals consumer's buckets whose time is past (by
// inbox.SealMargin) and stores the filters of their ids, so that the
// consumer's dedup probe of an id without a time skips them
// (docs/consumer.md, "Sealed buckets"). A bucket whose writers held it
// through bucketTries tries counts in st.BucketsBusy and is sealed by a
// later pass; one sealed by a pass that stopped before its filter was
// stored gets its filter now.
func sealBuckets(ctx context.Context, conn *pgxpool.Conn, consumer string, st *Stats) error {
	buckets, err := inbox.SealableBuckets(ctx, conn, consumer)
	if err != nil {
		return err
	}
	for _, b := range buckets {
		ok, err := withLockRetry(ctx, func() error { return inbox.SealBucket(ctx, conn, consumer, b) })
		if err != nil {
			return err
		}
		if !ok {
			st.BucketsBusy++
			continue
		}
		if _, err := inbox.BuildFilter(ctx, conn, consumer, b); err != nil {
			return err
		}
		st.BucketsSealed++
	}
	return nil
}

// pruneEffectBuckets makes consumer's current and next effects buckets and
// removes its expired ones: a bucket expires when its end is older than the
// policy's longest TTL (that is not permanent) and one bucket width. The
// rows it must keep move to the legacy partition (effects.KeepBucketRows,
// then effects.ExpireBucket for those that changed meanwhile), then it is
// truncated, then dropped; a bucket whose lock was not had in
// bucketTries tries is left for the next pass. A bucket that could not be
// made now is not an error: its rows go to the default partition (pruned
// row by row), and the next pass tries again.
func pruneEffectBuckets(ctx context.Context, conn *pgxpool.Conn, p *pass, consumer string, st *Stats) error {
	keep := p.policy.maxTTL()
	if keep == 0 {
		return nil
	}
	if _, err := withLockRetry(ctx, func() error {
		_, err := effects.EnsureBuckets(ctx, conn, consumer, keep)
		return err
	}); err != nil {
		return err
	}
	buckets, err := effects.Buckets(ctx, conn, consumer)
	if err != nil {
		return err
	}
	for _, b := range buckets {
		if !b.To.Before(p.now.Add(-(keep + b.Width()))) {
			continue
		}
		var rows int64 // the bucket's rows before its expiry, less those kept already
		if !b.Truncated {
			n, err := effects.BucketRows(ctx, conn, consumer, b)
			if err != nil {
				return err
			}
			// The long part (the bucket read, an inbox probe per done row)
			// under row locks only; then the lock, for the rest.
			kept, err := effects.KeepBucketRows(ctx, conn, consumer, b)
			st.EffectsKept += kept
			if err != nil {
				return err
			}
			rows = n - kept
		}
		expired, moved, err := expireAndDrop(ctx, st, b.Truncated,
			func() (int64, error) { return effects.ExpireBucket(ctx, conn, consumer, b) },
			func() error { return effects.DropBucket(ctx, conn, consumer, b) })
		if expired {
			st.Effects += max(0, rows-moved)
			st.EffectsKept += moved
			st.EffectsBuckets++
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// expireAndDrop empties a bucket by expire (its locked step, which returns
// the rows it moved out) and then drops it, each retried on lock waits
// (withLockRetry); a bucket truncated already is only dropped. A step whose
// lock was not had in bucketTries tries leaves the bucket for the next pass
// and counts in st.BucketsBusy (a bucket not emptied is not dropped).
// expired tells whether expire ran now.
func expireAndDrop(ctx context.Context, st *Stats, truncated bool, expire func() (int64, error), drop func() error) (expired bool, moved int64, err error) {
	if !truncated {
		ok, err := withLockRetry(ctx, func() error {
			var err error
			moved, err = expire()
			return err
		})
		if err != nil || !ok {
			if err == nil {
				st.BucketsBusy++
			}
			return false, 0, err
		}
		expired = true
	}
	ok, err := withLockRetry(ctx, drop)
	if err == nil && !ok {
		st.BucketsBusy++
	}
	return expired, moved, err
}

// withLockRetry runs f until it does not fail for a lock wait (SQLSTATE
// 55P03), at most bucketTries times with a growing pause; false when every
// try failed so.
func withLockRetry(ctx context.Context, f func() error) (bool, error) {
	wait := bucketBackoffMin
	for try := 1; ; try++ {
		err := f()
		var pgErr *pgconn.PgError
		if err == nil {
			return true, nil
		}
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
			return false, err
		}
		if try == bucketTries {
			return false, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, bucketBackoffMax)
	}
}
