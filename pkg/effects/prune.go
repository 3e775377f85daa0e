package effects

import (
	"context"
	"fmt"
	"time"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// qDeleteDoneOfEvents deletes the done rows of some events in the scopes
// under a prefix; an intent is never deleted.
const qDeleteDoneOfEvents = `
DELETE FROM onceflow.effects
 WHERE status = 'done' AND event_id = ANY($1::text[]) AND starts_with(scope, $2)`

// DeleteDone deletes the done ledger rows of eventIDs whose scope starts with
// scopePrefix (a consumer's: ConsumerScopePrefix) and returns how many it
// deleted. Retention calls it for the events whose inbox rows it pruned: an
// effect is kept exactly as long as the inbox row that fences its event.
func DeleteDone(ctx context.Context, db dbtx.DB, scopePrefix string, eventIDs []string) (int64, error) {
	tag, err := db.Exec(ctx, qDeleteDoneOfEvents, eventIDs, scopePrefix)
	if err != nil {
		return 0, fmt.Errorf("prune effects: %w", err)
	}
	return tag.RowsAffected(), nil
}

// qDeleteDoneOfInboxBucket deletes the done rows, in the scopes under $5,
// of the events whose processed, not late, inbox rows are in consumer $1's
// bucket ($2 lane, [$3, $4) event_at; partition-pruned to it), from the
// legacy and default partitions of the ledger only: the rows in an effects
// bucket go with their own bucket.
const qDeleteDoneOfInboxBucket = `
WITH legacy AS (
    DELETE FROM onceflow.effects_legacy e
     WHERE e.status = 'done' AND starts_with(e.scope, $5) AND e.event_id IS NOT NULL
       AND EXISTS (SELECT 1 FROM onceflow.inbox i
                    WHERE i.lane = $2 AND i.consumer = $1 AND i.event_at >= $3 AND i.event_at < $4
                      AND i.event_id = e.event_id AND i.status = 'processed' AND NOT i.late)
    RETURNING 1
), dflt AS (
    DELETE FROM onceflow.effects_default e
     WHERE e.status = 'done' AND e.owner = $5 AND e.event_id IS NOT NULL
       AND EXISTS (SELECT 1 FROM onceflow.inbox i
                    WHERE i.lane = $2 AND i.consumer = $1 AND i.event_at >= $3 AND i.event_at < $4
                      AND i.event_id = e.event_id AND i.status = 'processed' AND NOT i.late)
    RETURNING 1
)
SELECT (SELECT count(*) FROM legacy) + (SELECT count(*) FROM dflt)`

// DeleteDoneOfInboxBucket deletes the done ledger rows (in the scopes under
// scopePrefix, a consumer's ConsumerScopePrefix) of the events whose inbox
// rows retention is about to remove with their time bucket
// (inbox.ExpireBucket), and returns how many it deleted. It deletes only
// in the partitions pruned row by row, legacy and default: the consumer's
// effects buckets are removed whole (ExpireBucket).
func DeleteDoneOfInboxBucket(ctx context.Context, db dbtx.DB, scopePrefix, consumer, lane string, from, to time.Time) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, qDeleteDoneOfInboxBucket, consumer, lane, from, to, scopePrefix).Scan(&n); err != nil {
		return 0, fmt.Errorf("prune effects: %w", err)
	}
	return n, nil
}
