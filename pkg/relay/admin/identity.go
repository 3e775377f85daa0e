package admin

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
	"github.com/onceflow/onceflow/pkg/relay/internal/identity"
)

// Identity is this database's identity (onceflow.database_identity, made by
// the migrations). The relay's default transactional.id and its checkpoint
// key derive from ID, and every checkpoint record carries it.
type Identity = identity.Identity

// Place is where a database lives: its cluster's system identifier and its
// oid.
type Place = identity.Place

// ErrNoIdentity means onceflow.database_identity is missing or empty: the
// migrations have not run (`relay migrate`).
var ErrNoIdentity = identity.ErrNoIdentity

// ReadIdentity returns the database's identity.
func ReadIdentity(ctx context.Context, db dbtx.DB) (Identity, error) { return identity.Read(ctx, db) }

// CurrentPlace reads where the database the handle points to lives.
func CurrentPlace(ctx context.Context, db dbtx.DB) (Place, error) { return identity.Current(ctx, db) }

// AdoptIdentity records that this database replaces the one its identity
// was made in (moved, upgraded, restored in its place): the relay publishes
// under the same identity and uses its checkpoint, still checked row by row.
func AdoptIdentity(ctx context.Context, db dbtx.DB, note string) (identity.Identity, error) {
	here, err := identity.Current(ctx, db)
	if err != nil {
		return identity.Identity{}, err
	}
	id, err := identity.Scan(db.QueryRow(ctx, qIdentityAdopt, identity.NullIfEmpty(here.ClusterSystemID), here.DatabaseOID, note))
	if errors.Is(err, pgx.ErrNoRows) {
		return id, identity.ErrNoIdentity
	}
	return id, err
}

// ResetIdentity gives this database a new identity: its relay no longer
// uses (or fences) anything of the old one, and starts with no checkpoint.
// Rows the old identity's last transaction published but had not marked
// are published again (consumers drop them as duplicates by event id).
// Unsettled legacy checkpoints are discarded with it.
func ResetIdentity(ctx context.Context, db dbtx.DB, note string) (identity.Identity, error) {
	here, err := identity.Current(ctx, db)
	if err != nil {
		return identity.Identity{}, err
	}
	var id identity.Identity
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		id, err = identity.Scan(tx.QueryRow(ctx, qIdentityReset, identity.NullIfEmpty(here.ClusterSystemID), here.DatabaseOID, note))
		if errors.Is(err, pgx.ErrNoRows) {
			return identity.ErrNoIdentity
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, qLegacySettleAll, "discarded by relay identity reset")
		return err
	})
	return id, err
}
