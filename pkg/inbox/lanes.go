package inbox

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// The inbox is partitioned by (lane, consumer, event_at) (migration 028,
// docs/consumer.md "Storage layout"). An event type's lane is recorded
// once per consumer by onceflow.inbox_lane, from the retention classes the
// consumer's pruner published; the lane's time buckets are partitions that
// onceflow.inbox_ensure_buckets makes ahead of time.
const (
	// laneLegacy holds the rows of the table before the migration, the rows
	// retention kept out of an expired bucket, and new rows of types that
	// have no lane yet (no policy published): pruned row by row.
	laneLegacy = "legacy"
	// lanePermanent has one partition per consumer, never removed.
	lanePermanent = "permanent"
	// legacyRecheck is how long a type found without a lane (no policy
	// published) keeps writing to the legacy lane before asking again.
	legacyRecheck = time.Minute
	// laneSetRefresh is how often the set of the consumer's lanes that the
	// dedup probe covers is read again (a replica may have recorded a lane
	// this process has not met).
	laneSetRefresh = time.Minute
	// bucketRetry is when to try again to make a lane's buckets after a
	// failure (their lock was busy): the next bucket is made a whole
	// bucket ahead, so there are many tries before it is needed.
	bucketRetry = time.Minute
)

const (
	qLane          = `SELECT onceflow.inbox_lane($1, $2)`
	qEnsureBuckets = `SELECT extract(epoch FROM onceflow.inbox_ensure_buckets($1, $2))::float8`
	qLaneSet       = `SELECT DISTINCT lane FROM onceflow.inbox_lanes WHERE consumer = $1`
)

// laneBook caches a consumer's lanes: a recorded lane never changes, so
// the cache is never wrong, only incomplete. The zero value is ready.
type laneBook struct {
	mu sync.Mutex
	// byType is the recorded lane of each type met.
	byType map[string]string
	// legacyUntil is when to ask again for a type that had no lane.
	legacyUntil map[string]time.Time
	// bucketEnd is the end of the bucket last ensured per lane (the next
	// one exists too): past it, the buckets are ensured again.
	bucketEnd map[string]time.Time
	// all is every lane the dedup probe covers, read at setAt.
	all   []string
	setAt time.Time
	// sealed is the consumer's sealed buckets with their filters
	// (sealed.go), read again after all is (sealedDue) by refreshSealed,
	// outside mu: the first read after a start with a 100M-row inbox
	// takes some 110 MB and a second, and the other partitions' batches go
	// on meanwhile with the set before (any set is right, an older one
	// only probes more buckets).
	sealed      sealedSet
	sealedStats sealedStats
	sealedDue   bool
	// loading is held by the one goroutine reading the sealed set.
	loading sync.Mutex
	// since is onceflow.inbox_id_time.since, read once (Valid).
	since pgtype.Timestamptz
}

// resolve returns the lane of each type of types (index for index) and the
// lanes the dedup probe must cover, recording new types' lanes and making
// their current buckets. A bucket that cannot be made is not an error (its
// rows go to the default partition, still probed and pruned row by row);
// warn hears why.
func (b *laneBook) resolve(ctx context.Context, db dbtx.DB, consumer string, types []string, warn func(error)) (lanes, probe []string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.byType == nil {
		b.byType, b.legacyUntil, b.bucketEnd = map[string]string{}, map[string]time.Time{}, map[string]time.Time{}
	}
	now := time.Now()
	refresh := now.Sub(b.setAt) > laneSetRefresh
	lanes = make([]string, len(types))
	for i, t := range types {
		if l, ok := b.byType[t]; ok {
			lanes[i] = l
			continue
		}
		if until, ok := b.legacyUntil[t]; ok && now.Before(until) {
			lanes[i] = laneLegacy
			continue
		}
		var l string
		if err := db.QueryRow(ctx, qLane, consumer, t).Scan(&l); err != nil {
			return nil, nil, fmt.Errorf("inbox lane of %q: %w", t, err)
		}
		lanes[i] = l
		if l == laneLegacy {
			b.legacyUntil[t] = now.Add(legacyRecheck)
			continue
		}
		delete(b.legacyUntil, t)
		b.byType[t] = l
		refresh = true
	}
	for _, l := range lanes {
		if l == laneLegacy {
			continue
		}
		if end, ok := b.bucketEnd[l]; ok && now.Before(end) {
			continue
		}
		var epoch float64
		end := now.Add(bucketRetry)
		if err := db.QueryRow(ctx, qEnsureBuckets, consumer, l).Scan(&epoch); err != nil {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			warn(fmt.Errorf("inbox buckets of lane %s (its rows go to the default partition meanwhile): %w", l, err))
		} else if math.IsInf(epoch, 1) {
			end = time.Unix(1<<40, 0) // the permanent lane: one partition
		} else {
			end = time.Unix(0, int64(epoch*1e9))
		}
		b.bucketEnd[l] = end
	}
	if refresh {
		rows, err := db.Query(ctx, qLaneSet, consumer)
		if err != nil {
			return nil, nil, fmt.Errorf("inbox lanes: %w", err)
		}
		all := []string{laneLegacy, lanePermanent}
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				rows.Close()
				return nil, nil, fmt.Errorf("inbox lanes: %w", err)
			}
			if !slices.Contains(all, l) {
				all = append(all, l)
			}
		}
		if err := rows.Err(); err != nil {
			return nil, nil, fmt.Errorf("inbox lanes: %w", err)
		}
		slices.Sort(all)
		b.all, b.setAt = all, now
		b.sealedDue = true
	}
	return lanes, b.all, nil
}

// refreshSealed reads the sealed set again, its filters in at most budget
// bytes, when the lane set was read since it last did and no other
// goroutine is reading it. A set that cannot be read keeps the one before
// (a filter of a bucket since dropped only leaves out a partition that is
// gone): the probe is right with any of them; warn hears why.
func (b *laneBook) refreshSealed(ctx context.Context, db dbtx.DB, consumer string, budget int64, warn func(error)) error {
	if !b.loading.TryLock() {
		return nil
	}
	defer b.loading.Unlock()
	b.mu.Lock()
	due, old := b.sealedDue, b.sealed
	b.sealedDue = false
	b.mu.Unlock()
	if !due {
		return nil
	}
	sealed, st, err := loadSealed(ctx, db, consumer, old, budget)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		warn(fmt.Errorf("%w (the dedup probe of ids without a time reads every bucket not known sealed meanwhile)", err))
		return nil
	}
	b.mu.Lock()
	b.sealed, b.sealedStats = sealed, st
	b.mu.Unlock()
	return nil
}

// loadedSealed returns what the sealed set as last read holds.
func (b *laneBook) loadedSealed() sealedStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sealedStats
}

// sealedSet returns the sealed buckets as last read.
func (b *laneBook) sealedSet() sealedSet {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sealed
}

// probeLanes returns the lanes the dedup probe covers, reading them when
// they were never read or are old.
func (b *laneBook) probeLanes(ctx context.Context, db dbtx.DB, consumer string) ([]string, error) {
	_, probe, err := b.resolve(ctx, db, consumer, nil, func(error) {})
	return probe, err
}
