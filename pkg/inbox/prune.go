package inbox

import (
	"context"
	"fmt"
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

// Statements of the inbox's pruning. Only processed rows that were not
// applied late are ever pruned: parked, held and dead rows wait for the
// guard or an operator, and a late row lies in a given-up range, where only
// its inbox row tells its redelivery from a first arrival.
const (
	// $1 consumer, $2 received before, $3/$4 the cursor (received_at,
	// event_id), $5 limit.
	qScanProcessed = `
SELECT event_id, event_type, received_at FROM onceflow.inbox
 WHERE consumer = $1 AND status = 'processed' AND NOT late AND received_at < $2
   AND (received_at, event_id) > ($3, $4)
 ORDER BY received_at, event_id LIMIT $5`
	qDeleteProcessed = `
DELETE FROM onceflow.inbox
 WHERE consumer = $1 AND event_id = ANY($2::text[]) AND status = 'processed' AND NOT late`
	qOldestProcessed = `
SELECT event_type, (extract(epoch FROM now() - min(received_at)) * 1e6)::bigint
  FROM onceflow.inbox WHERE consumer = $1 AND status = 'processed' GROUP BY event_type`
)

// ScanProcessed returns up to limit processed rows of consumer received
// before before and after the cursor (afterAt, afterID), in (received_at,
// event_id) order; late rows are never returned.
func ScanProcessed(ctx context.Context, db dbtx.DB, consumer string, before, afterAt time.Time, afterID string, limit int) ([]ProcessedRow, error) {
	rows, err := db.Query(ctx, qScanProcessed, consumer, before, afterAt, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("scan inbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ProcessedRow])
	if err != nil {
		err = fmt.Errorf("scan inbox: %w", err)
	}
	return out, err
}

// DeleteProcessed deletes consumer's rows of eventIDs that are still
// processed and not late, and returns how many it deleted.
func DeleteProcessed(ctx context.Context, db dbtx.DB, consumer string, eventIDs []string) (int64, error) {
	tag, err := db.Exec(ctx, qDeleteProcessed, consumer, eventIDs)
	if err != nil {
		return 0, fmt.Errorf("prune inbox: %w", err)
	}
	return tag.RowsAffected(), nil
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
