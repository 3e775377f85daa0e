package inbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// ProcessedRow is a processed inbox row as retention (pkg/retention) sees
// it: the candidates for pruning.
type ProcessedRow struct {
	EventID    string
	EventType  string
	ReceivedAt time.Time
}

// Statements of the inbox's row-by-row pruning, which runs in the
// partitions that are not time buckets (migration 028): the legacy one
// (the rows from before the partitioning, the rows retention kept out of
// expired buckets, the types that had no lane yet) and the default one.
// Each statement names its partition, never the partitioned table: a
// statement on onceflow.inbox would plan (a prepared one: lock) every
// partition. Only processed rows that were not applied late are ever
// pruned: parked, held and dead rows wait for the guard or an operator,
// and a late row lies in a given-up range, where only its inbox row tells
// its redelivery from a first arrival.
const (
	// $1 consumer, $2 received before, $3/$4 the cursor (received_at,
	// event_id), $5 limit.
	qScanProcessed = `
SELECT event_id, event_type, received_at FROM onceflow.%s
 WHERE consumer = $1 AND status = 'processed' AND NOT late AND received_at < $2
   AND (received_at, event_id) > ($3, $4)
 ORDER BY received_at, event_id LIMIT $5`
	qDeleteProcessed = `
DELETE FROM onceflow.%s
 WHERE consumer = $1 AND event_id = ANY($2::text[]) AND status = 'processed' AND NOT late`
	qOldestProcessed = `
SELECT event_type, (extract(epoch FROM now() - min(received_at)) * 1e6)::bigint
  FROM onceflow.inbox WHERE consumer = $1 AND status = 'processed' GROUP BY event_type`
)

// RowPartitions are the inbox partitions pruned row by row (ScanProcessed,
// DeleteProcessed).
var RowPartitions = []string{"inbox_legacy", "inbox_default"}

func rowPartition(p string) (string, error) {
	for _, q := range RowPartitions {
		if p == q {
			return p, nil
		}
	}
	return "", fmt.Errorf("inbox: %q is not a partition pruned row by row", p)
}

// ScanProcessed returns up to limit processed rows of consumer in
// partition (one of RowPartitions) received before before and after the
// cursor (afterAt, afterID), in (received_at, event_id) order; late rows
// are never returned.
func ScanProcessed(ctx context.Context, db dbtx.DB, partition, consumer string, before, afterAt time.Time, afterID string, limit int) ([]ProcessedRow, error) {
	p, err := rowPartition(partition)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, fmt.Sprintf(qScanProcessed, p), consumer, before, afterAt, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("scan inbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ProcessedRow])
	if err != nil {
		err = fmt.Errorf("scan inbox: %w", err)
	}
	return out, err
}

// DeleteProcessed deletes consumer's rows of eventIDs in partition (one of
// RowPartitions) that are still processed and not late, and returns how
// many it deleted.
func DeleteProcessed(ctx context.Context, db dbtx.DB, partition, consumer string, eventIDs []string) (int64, error) {
	p, err := rowPartition(partition)
	if err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, fmt.Sprintf(qDeleteProcessed, p), consumer, eventIDs)
	if err != nil {
		return 0, fmt.Errorf("prune inbox: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Class is a retention class as the inbox records it for choosing a new
// type's lane: Pattern is Glob as an anchored regular expression (GlobRegexp)
// and Keep is zero for permanent.
type Class struct {
	Glob    string
	Pattern string
	Keep    time.Duration
}

// PublishClasses replaces the retention classes recorded for consumer (in
// order, first match wins). A type met for the first time gets the lane of
// its class then, for good (onceflow.inbox_lane).
func PublishClasses(ctx context.Context, db dbtx.DB, consumer string, classes []Class) error {
	globs := make([]string, len(classes))
	patterns := make([]string, len(classes))
	keeps := make([]*int64, len(classes))
	for i, c := range classes {
		globs[i], patterns[i] = c.Glob, c.Pattern
		if c.Keep > 0 {
			s := int64((c.Keep + time.Second - 1) / time.Second)
			keeps[i] = &s
		}
	}
	_, err := db.Exec(ctx, `
WITH gone AS (DELETE FROM onceflow.inbox_classes WHERE consumer = $1 AND ord > cardinality($2::text[]))
INSERT INTO onceflow.inbox_classes (consumer, ord, glob, pattern, keep_s)
SELECT $1, c.ord, c.glob, c.pattern, c.keep_s
FROM unnest($2::text[], $3::text[], $4::bigint[]) WITH ORDINALITY AS c(glob, pattern, keep_s, ord)
ON CONFLICT (consumer, ord) DO UPDATE
SET glob = EXCLUDED.glob, pattern = EXCLUDED.pattern, keep_s = EXCLUDED.keep_s, published_at = now()
WHERE (onceflow.inbox_classes.glob, onceflow.inbox_classes.pattern, onceflow.inbox_classes.keep_s)
      IS DISTINCT FROM (EXCLUDED.glob, EXCLUDED.pattern, EXCLUDED.keep_s)`, consumer, globs, patterns, keeps)
	if err != nil {
		return fmt.Errorf("publish retention classes: %w", err)
	}
	return nil
}

// GlobRegexp is glob (path.Match syntax) as an anchored regular expression
// that PostgreSQL's ~ and Go's regexp read alike.
func GlobRegexp(glob string) string {
	var b strings.Builder
	b.WriteString("^(?:")
	lit := func(c byte) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80 {
			b.WriteByte(c)
		} else {
			b.WriteByte('\\')
			b.WriteByte(c)
		}
	}
	for i := 0; i < len(glob); i++ {
		switch c := glob[i]; c {
		case '*':
			b.WriteString("[^/]*")
		case '?':
			b.WriteString("[^/]")
		case '\\':
			if i+1 < len(glob) {
				i++
				lit(glob[i])
			}
		case '[':
			b.WriteByte('[')
			i++
			if i < len(glob) && glob[i] == '^' {
				b.WriteByte('^')
				i++
			}
			for ; i < len(glob) && glob[i] != ']'; i++ {
				switch glob[i] {
				case '\\':
					if i+1 < len(glob) {
						i++
						lit(glob[i])
					}
				case '-':
					b.WriteByte('-')
				default:
					lit(glob[i])
				}
			}
			b.WriteByte(']')
		default:
			lit(c)
		}
	}
	b.WriteString(")$")
	return b.String()
}

// Bucket is one time-bucket partition of a TTL lane.
type Bucket struct {
	Lane      string
	From, To  time.Time
	Truncated bool
}

// Buckets lists consumer's time buckets (TTL lanes only), oldest first.
func Buckets(ctx context.Context, db dbtx.DB, consumer string) ([]Bucket, error) {
	rows, err := db.Query(ctx, `
SELECT lane, from_at, to_at, truncated_at IS NOT NULL FROM onceflow.inbox_buckets
 WHERE consumer = $1 AND lane LIKE 'ttl-%' ORDER BY from_at, lane`, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox buckets: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Bucket])
	if err != nil {
		return nil, fmt.Errorf("inbox buckets: %w", err)
	}
	return out, nil
}

// LaneTypes returns the event types recorded in each of consumer's lanes.
func LaneTypes(ctx context.Context, db dbtx.DB, consumer string) (map[string][]string, error) {
	rows, err := db.Query(ctx, `SELECT lane, event_type FROM onceflow.inbox_lanes WHERE consumer = $1`, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox lanes: %w", err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var l, t string
		if err := rows.Scan(&l, &t); err != nil {
			return nil, fmt.Errorf("inbox lanes: %w", err)
		}
		out[l] = append(out[l], t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox lanes: %w", err)
	}
	return out, nil
}

// BucketRows returns how many rows consumer's bucket holds: the planner's
// estimate once the bucket was analyzed (a count of a bucket of millions
// of rows took as long as removing it), else an exact count.
func BucketRows(ctx context.Context, db dbtx.DB, consumer string, b Bucket) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `
SELECT c.reltuples::bigint FROM onceflow.inbox_buckets b
  JOIN pg_class c ON c.relname = b.relname AND c.relnamespace = 'onceflow'::regnamespace
 WHERE b.consumer = $1 AND b.lane = $2 AND b.from_at = $3`, consumer, b.Lane, b.From).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("inbox bucket size: %w", err)
	}
	if n >= 0 {
		return n, nil
	}
	err = db.QueryRow(ctx, `
SELECT count(*) FROM onceflow.inbox WHERE lane = $2 AND consumer = $1 AND event_at >= $3 AND event_at < $4`,
		consumer, b.Lane, b.From, b.To).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count inbox bucket: %w", err)
	}
	return n, nil
}

// ExpireBucket moves the rows retention keeps (parked, held, dead, late)
// out of consumer's bucket into the legacy partition and truncates it
// (onceflow.inbox_expire_bucket: waits at most 100 ms for its lock, then
// fails with SQLSTATE 55P03). It returns how many rows it moved.
func ExpireBucket(ctx context.Context, db dbtx.DB, consumer string, b Bucket) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, `SELECT onceflow.inbox_expire_bucket($1, $2, $3)`, consumer, b.Lane, b.From).Scan(&n); err != nil {
		return 0, fmt.Errorf("expire inbox bucket %s %s: %w", b.Lane, b.From.UTC().Format(time.RFC3339), err)
	}
	return n, nil
}

// DropBucket drops consumer's truncated bucket (onceflow.inbox_drop_bucket:
// waits at most 100 ms for its lock on onceflow.inbox, then fails with
// SQLSTATE 55P03).
func DropBucket(ctx context.Context, db dbtx.DB, consumer string, b Bucket) error {
	if _, err := db.Exec(ctx, `SELECT onceflow.inbox_drop_bucket($1, $2, $3)`, consumer, b.Lane, b.From); err != nil {
		return fmt.Errorf("drop inbox bucket %s %s: %w", b.Lane, b.From.UTC().Format(time.RFC3339), err)
	}
	return nil
}

// LaneTTL is the TTL a lane's name records ("ttl-<seconds>s"; 0 for
// another lane).
func LaneTTL(lane string) time.Duration {
	var s int64
	if _, err := fmt.Sscanf(lane, "ttl-%ds", &s); err != nil {
		return 0
	}
	return time.Duration(s) * time.Second
}

// OldestProcessed returns, per event type, the age of consumer's oldest
// processed row on the database's clock. It reads one aggregate over the
// consumer's processed rows (a scan: run it at a pruning interval, not more
// often).
func OldestProcessed(ctx context.Context, db dbtx.DB, consumer string) (map[string]time.Duration, error) {
	rows, err := db.Query(ctx, qOldestProcessed, consumer)
	if err != nil {
		return nil, fmt.Errorf("oldest inbox rows: %w", err)
	}
	defer rows.Close()
	ages := map[string]time.Duration{}
	for rows.Next() {
		var typ string
		var micros int64
		if err := rows.Scan(&typ, &micros); err != nil {
			return nil, fmt.Errorf("oldest inbox rows: %w", err)
		}
		ages[typ] = time.Duration(micros) * time.Microsecond
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("oldest inbox rows: %w", err)
	}
	return ages, nil
}
