package inbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// Sealed buckets (migration 037, docs/consumer.md "Sealed buckets: the
// probe of an id without a time"). A row goes to the bucket of its
// transaction's now(), so once a bucket's time is past by a margin no new
// row belongs in it. Retention's pass seals it (SealBucket: a trigger
// refuses every insert into it from then on, SQLSTATE 40001) and stores a
// filter of the ids it holds that are not UUIDv7s (BuildFilter). The
// consumer loads the filters (laneBook.sealed) and probes an id that
// carries no time only in the sealed buckets whose filter may hold it, and
// in every bucket that is not sealed: an id in none of the filters is
// "clean", and its look-up leaves the sealed buckets out of the plan.
//
// Why the look-up may skip them: the filter was read after the seal
// committed, and the seal waited for every transaction that had written to
// the bucket, so it holds every id of the bucket; no row can be written to
// the bucket after the seal; the default partition holds no row of a range
// that has a bucket (a bucket is never made for a range the default
// partition has rows of, and rows of a range with a bucket go to it); rows
// retention keeps out of an expired bucket move to the legacy lane, which
// every look-up reads whole. A UUIDv7 id is never clean: its look-up is
// bounded by its time (idtime.go), and the filters leave UUIDv7 ids out.

// SealMargin is how long after a bucket's end retention seals it: a
// transaction older than that which has not yet written its rows fails
// with SQLSTATE 40001 and is retried in a new one.
const SealMargin = 5 * time.Minute

// SealableBuckets lists consumer's time buckets that ended at least
// SealMargin ago on the database's clock, are not truncated and have no
// filter yet: retention seals them and builds their filters.
func SealableBuckets(ctx context.Context, db dbtx.DB, consumer string) ([]Bucket, error) {
	rows, err := db.Query(ctx, `
SELECT b.lane, b.from_at, b.to_at, false FROM onceflow.inbox_buckets b
 WHERE b.consumer = $1 AND b.lane LIKE 'ttl-%' AND b.truncated_at IS NULL
   AND b.to_at <= now() - $2::interval
   AND NOT EXISTS (SELECT 1 FROM onceflow.inbox_filters f
                    WHERE f.consumer = b.consumer AND f.lane = b.lane AND f.from_at = b.from_at)
 ORDER BY b.from_at, b.lane`, consumer, SealMargin)
	if err != nil {
		return nil, fmt.Errorf("inbox buckets to seal: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Bucket])
	if err != nil {
		return nil, fmt.Errorf("inbox buckets to seal: %w", err)
	}
	return out, nil
}

// SealBucket seals consumer's bucket (onceflow.inbox_seal_bucket: a
// trigger refuses every insert into it from the commit on; waits at most
// 100 ms for the bucket's writers, then fails with SQLSTATE 55P03). Sealing
// a sealed bucket does nothing.
func SealBucket(ctx context.Context, db dbtx.DB, consumer string, b Bucket) error {
	if _, err := db.Exec(ctx, `SELECT onceflow.inbox_seal_bucket($1, $2, $3)`, consumer, b.Lane, b.From); err != nil {
		return fmt.Errorf("seal inbox bucket %s %s: %w", b.Lane, b.From.UTC().Format(time.RFC3339), err)
	}
	return nil
}

// BuildFilter reads the ids of consumer's sealed bucket b, run after
// SealBucket committed, and stores the filter of those that are not
// UUIDv7s (onceflow.inbox_put_filter refuses a bucket that is not
// sealed). It returns how many ids the filter holds. It reads the bucket's
// ids in pages of filterPage, each its own statement, so that no snapshot
// is held for longer than a page takes (some 20 ms): one statement over a
// bucket of 10M rows held one for 3 s, over 100M rows for 30 s.
func BuildFilter(ctx context.Context, db dbtx.DB, consumer string, b Bucket) (int, error) {
	return buildFilter(ctx, db, consumer, b, filterPage)
}

// filterPage is how many ids BuildFilter reads per statement.
const filterPage = 50_000

// qFilterPage is the next page of a bucket's ids after $5, in the order of
// the key inbox_key (consumer, event_id, lane, event_at): every id of the
// bucket is read once across pages, whatever other transactions commit
// between them (no id is inserted into a sealed bucket; an update of a
// row keeps its id; only expiry removes rows, and the filter goes with the
// bucket).
const qFilterPage = `
SELECT event_id FROM onceflow.inbox
 WHERE consumer = $1 AND lane = $2 AND event_at >= $3 AND event_at < $4 AND event_id > $5
 ORDER BY event_id LIMIT $6`

func buildFilter(ctx context.Context, db dbtx.DB, consumer string, b Bucket, page int) (int, error) {
	where := fmt.Sprintf("inbox bucket %s %s", b.Lane, b.From.UTC().Format(time.RFC3339))
	// Sized by the bucket's row count (the planner's estimate once it was
	// analyzed), so that the ids stream into the filter: a filter sized
	// too small holds every id all the same, with more false positives.
	rowsEst, err := BucketRows(ctx, db, consumer, b)
	if err != nil {
		return 0, err
	}
	f := newKeyFilter(int(max(rowsEst, 1)))
	n := 0
	for after := ""; ; {
		rows, err := db.Query(ctx, qFilterPage, pgx.QueryExecModeExec, consumer, b.Lane, b.From, b.To, after, page)
		if err != nil {
			return 0, fmt.Errorf("read the ids of %s: %w", where, err)
		}
		read := 0
		for rows.Next() {
			id := string(rows.RawValues()[0])
			after = id
			read++
			if _, ok := eventIDTime(id); ok {
				continue
			}
			f.add(keyHash(id))
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, fmt.Errorf("read the ids of %s: %w", where, err)
		}
		if read < page {
			break
		}
	}
	if n == 0 {
		f = newKeyFilter(0) // UUIDv7s only: an empty filter, a few bytes
	}
	if _, err := db.Exec(ctx, `SELECT onceflow.inbox_put_filter($1, $2, $3, $4, $5)`,
		consumer, b.Lane, b.From, int64(n), f.marshal()); err != nil {
		return 0, fmt.Errorf("store the filter of %s: %w", where, err)
	}
	return n, nil
}

// sealedBucket is a sealed bucket's range and the filter of its ids.
type sealedBucket struct {
	from, to time.Time
	filter   *keyFilter
}

// sealedSet is the sealed buckets of a consumer by lane, each lane's in
// order; it is replaced whole, never changed.
type sealedSet map[string][]sealedBucket

const (
	qSealedList = `
SELECT b.lane, b.from_at, b.to_at, octet_length(f.filter) FROM onceflow.inbox_buckets b
  JOIN onceflow.inbox_filters f ON f.consumer = b.consumer AND f.lane = b.lane AND f.from_at = b.from_at
 WHERE b.consumer = $1 AND b.sealed_at IS NOT NULL
 ORDER BY b.lane, b.from_at`
	qSealedFilter = `SELECT filter FROM onceflow.inbox_filters WHERE consumer = $1 AND lane = $2 AND from_at = $3`
)

// sealedStats is what a loaded sealed set holds: the filters' bytes, and
// the sealed buckets whose filters did not fit in the budget (probed as if
// not sealed).
type sealedStats struct {
	bytes    int64
	unloaded int
}

// loadSealed reads consumer's sealed buckets that have a filter, reusing
// the filters of old (a filter never changes) and reading the new ones.
// The filters it keeps take at most budget bytes, the smallest first (as
// many buckets left out of the probe as the budget buys; any subset is
// right, a bucket without its filter is probed as if not sealed).
func loadSealed(ctx context.Context, db dbtx.DB, consumer string, old sealedSet, budget int64) (sealedSet, sealedStats, error) {
	rows, err := db.Query(ctx, qSealedList, consumer)
	if err != nil {
		return nil, sealedStats{}, fmt.Errorf("inbox sealed buckets: %w", err)
	}
	type ref struct {
		lane     string
		from, to time.Time
		size     int64
	}
	var refs []ref
	var r ref
	if _, err := pgx.ForEachRow(rows, []any{&r.lane, &r.from, &r.to, &r.size}, func() error {
		refs = append(refs, r)
		return nil
	}); err != nil {
		return nil, sealedStats{}, fmt.Errorf("inbox sealed buckets: %w", err)
	}
	// The budget's choice, smallest first; refs stays in lane and time
	// order, as each lane's list must be.
	bySize := make([]int, len(refs))
	for i := range bySize {
		bySize[i] = i
	}
	slices.SortStableFunc(bySize, func(a, b int) int { return cmp.Compare(refs[a].size, refs[b].size) })
	var st sealedStats
	keep := make([]bool, len(refs))
	kept := 0
	for _, i := range bySize {
		if st.bytes+refs[i].size > budget {
			break
		}
		st.bytes += refs[i].size
		keep[i] = true
		kept++
	}
	st.unloaded = len(refs) - kept
	out := sealedSet{}
	for i, r := range refs {
		if !keep[i] {
			continue
		}
		where := fmt.Sprintf("inbox filter of bucket %s %s", r.lane, r.from.UTC().Format(time.RFC3339))
		j := slices.IndexFunc(old[r.lane], func(s sealedBucket) bool { return s.from.Equal(r.from) })
		if j >= 0 {
			out[r.lane] = append(out[r.lane], old[r.lane][j])
			continue
		}
		var data []byte
		if err := db.QueryRow(ctx, qSealedFilter, consumer, r.lane, r.from).Scan(&data); err != nil {
			return nil, sealedStats{}, fmt.Errorf("%s: %w", where, err)
		}
		f, err := unmarshalKeyFilter(data)
		if err != nil {
			return nil, sealedStats{}, fmt.Errorf("%s: %w", where, err)
		}
		out[r.lane] = append(out[r.lane], sealedBucket{from: r.from, to: r.to, filter: f})
	}
	return out, st, nil
}

// split divides a batch's ids into those the look-up must probe as before
// (dirty: UUIDv7s, which their time bounds, and ids some sealed bucket's
// filter of lanes may hold) and the clean ones, in no sealed bucket of
// lanes. With no sealed bucket every id is dirty.
func (s sealedSet) split(ids []string, lanes []string) (dirty, clean []string) {
	var filters []*keyFilter
	for _, l := range lanes {
		for _, b := range s[l] {
			filters = append(filters, b.filter)
		}
	}
	if len(filters) == 0 {
		return ids, nil
	}
next:
	for _, id := range ids {
		if _, ok := eventIDTime(id); ok {
			dirty = append(dirty, id)
			continue
		}
		h := keyHash(id)
		for _, f := range filters {
			if f.mayHave(h) {
				dirty = append(dirty, id)
				continue next
			}
		}
		clean = append(clean, id)
	}
	return dirty, clean
}

// cleanLookup is the look-up of one clean id, the expression id: as the
// look-up of withLanes, one arm per lane with lane and consumer side by
// side, each lane's arms covering only the time outside its sealed
// buckets (the legacy lane, and a lane with none, whole). The bounds are
// constants, so the planner leaves the sealed buckets out of the plan.
func (s sealedSet) cleanLookup(id string, lanes []string) string {
	var arms []string
	for _, l := range lanes {
		arm := lookupArm(l, id)
		// The time outside the lane's sealed buckets (in order, never
		// overlapping): before the first, between two that do not touch,
		// after the last.
		var end time.Time
		for i, b := range s[l] {
			switch {
			case i == 0:
				arms = append(arms, arm+timeRange("", timeLiteral(b.from)))
			case b.from.After(end):
				arms = append(arms, arm+timeRange(timeLiteral(end), timeLiteral(b.from)))
			}
			end = b.to
		}
		lo := ""
		if len(s[l]) > 0 {
			lo = timeLiteral(end)
		}
		arms = append(arms, arm+timeRange(lo, ""))
	}
	return "(" + strings.Join(arms, " UNION ALL ") + " LIMIT 1)"
}

// timeRange is the condition event_at in [lo, hi), either side open when "".
func timeRange(lo, hi string) string {
	var c string
	if lo != "" {
		c += " AND x.event_at >= " + lo
	}
	if hi != "" {
		c += " AND x.event_at < " + hi
	}
	return c
}

// timeLiteral writes t as a timestamptz constant.
func timeLiteral(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999Z07:00") + "'::timestamptz"
}
