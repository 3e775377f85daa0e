package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
	"github.com/onceflow/onceflow/pkg/relay/internal/identity"
)

// LegacyCheckpoint is a shard whose relay ran before identities existed
// (onceflow.relay_legacy_checkpoint).
type LegacyCheckpoint struct {
	Shard     string
	NotedAt   time.Time
	Decision  string // "", "adopt" or "discard"
	DecidedAt *time.Time
	DecidedBy string
	// Note is why, as the operator said it with the decision.
	Note      string
	SettledAt *time.Time
	Outcome   string
}

// ListLegacyCheckpoints lists the legacy checkpoint rows, settled or not.
func ListLegacyCheckpoints(ctx context.Context, db dbtx.DB) ([]LegacyCheckpoint, error) {
	rows, err := db.Query(ctx, qLegacyList)
	if err != nil {
		return nil, fmt.Errorf("list legacy checkpoints: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (LegacyCheckpoint, error) {
		var l LegacyCheckpoint
		var d, by, note, out *string
		err := r.Scan(&l.Shard, &l.NotedAt, &d, &l.DecidedAt, &by, &note, &l.SettledAt, &out)
		l.Decision, l.DecidedBy, l.Note, l.Outcome = identity.Deref(d), identity.Deref(by), identity.Deref(note), identity.Deref(out)
		return l, err
	})
}

// ErrNoLegacyCheckpoint means the shard has no unsettled legacy checkpoint.
var ErrNoLegacyCheckpoint = errors.New("no unsettled legacy checkpoint for this shard")

// DecideLegacyCheckpoint records an operator's decision about shard's
// legacy checkpoint: "adopt" (it is this database's: the relay marks the
// rows it names) or "discard" (it may be another database's: the rows it
// names are published again). The relay carries it out at its next start.
// note (why) is kept with the decision.
func DecideLegacyCheckpoint(ctx context.Context, db dbtx.DB, shard, decision, note string) error {
	if decision != "adopt" && decision != "discard" {
		return fmt.Errorf("legacy checkpoint decision %q: want adopt or discard", decision)
	}
	tag, err := db.Exec(ctx, qLegacyDecide, shard, decision, note)
	if err != nil {
		return fmt.Errorf("record legacy checkpoint decision: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNoLegacyCheckpoint
	}
	return nil
}
