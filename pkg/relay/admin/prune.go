package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// PublishedRow is a published outbox row as retention (pkg/retention) sees
// it.
type PublishedRow struct {
	ID          int64
	EventType   string
	PublishedAt time.Time
}

// ScanPublished returns up to limit published rows published before before
// and after the cursor (afterAt, afterID), in (published at, id) order; a
// row's publish time is its batch's in onceflow.outbox_published.
// Unpublished rows are never returned.
func ScanPublished(ctx context.Context, db dbtx.DB, before, afterAt time.Time, afterID int64, limit int) ([]PublishedRow, error) {
	rows, err := db.Query(ctx, qScanPublished, before, afterAt, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("scan outbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[PublishedRow])
	if err != nil {
		err = fmt.Errorf("scan outbox: %w", err)
	}
	return out, err
}

// DeletePublished deletes the rows of ids that are published and returns
// how many it deleted; an unpublished row is never deleted.
func DeletePublished(ctx context.Context, db dbtx.DB, ids []int64) (int64, error) {
	tag, err := db.Exec(ctx, qDeletePublishedIDs, ids)
	if err != nil {
		return 0, fmt.Errorf("prune outbox: %w", err)
	}
	return tag.RowsAffected(), nil
}

// qPruneSetAside deletes resolved set-aside rows older than $1 (an
// interval), at most $2, through onceflow.prune_outbox_set_aside (migration
// console_set_aside: it runs with its owner's rights and refuses a keep
// under 1 day).
const qPruneSetAside = `SELECT onceflow.prune_outbox_set_aside($1::interval, $2)`

// PruneSetAside deletes at most limit rows of onceflow.outbox_set_aside
// resolved (published or skipped) more than keep ago, by the database's
// clock, and returns how many it deleted. Open rows are never deleted; a
// keep under 24h is refused by the database (SQLSTATE 42501).
func PruneSetAside(ctx context.Context, db dbtx.DB, keep time.Duration, limit int) (int64, error) {
	return pruneCall(ctx, db, qPruneSetAside, "prune set-aside rows", keep, limit)
}

// pruneCall runs a SQL prune function that returns how many rows it
// deleted.
func pruneCall(ctx context.Context, db dbtx.DB, q, what string, args ...any) (int64, error) {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	n, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return n, nil
}
