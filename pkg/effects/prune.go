package effects

import (
	"context"
	"fmt"

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
