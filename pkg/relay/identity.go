package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// Identity is this database's identity (onceflow.database_identity, made by
// the migrations). The relay's default transactional.id and its checkpoint
// key derive from ID, and every checkpoint record carries it.
type Identity struct {
	ID        string
	CreatedAt time.Time
	// Place is where the identity belongs; a relay that runs somewhere else
	// refuses to publish (the database was copied or moved).
	Place Place
	// FirstUsedAt is when a relay first started publishing under it.
	FirstUsedAt *time.Time
	// ChangedAt, ChangedBy and ChangeNote record the last
	// `relay identity adopt` or `reset`.
	ChangedAt  *time.Time
	ChangedBy  string
	ChangeNote string
}

// Place is where a database lives: its cluster's system identifier (empty
// when the role may not read pg_control_system()) and its oid. A copy made
// with CREATE DATABASE … TEMPLATE gets another oid; a dump restored
// elsewhere, or pg_upgrade, another cluster.
type Place struct {
	ClusterSystemID string
	DatabaseOID     uint32
}

func (p Place) String() string {
	c := p.ClusterSystemID
	if c == "" {
		c = "unknown"
	}
	return fmt.Sprintf("database oid %d in cluster %s", p.DatabaseOID, c)
}

// Same reports whether p and o are the same place; an unknown cluster
// compares by oid alone.
func (p Place) Same(o Place) bool {
	if p.DatabaseOID != o.DatabaseOID {
		return false
	}
	return p.ClusterSystemID == "" || o.ClusterSystemID == "" || p.ClusterSystemID == o.ClusterSystemID
}

// DefaultTransactionalID is the transactional.id a relay of shard uses when
// no TransactionalIDPrefix is configured.
func DefaultTransactionalID(identity, shard string) string {
	return "onceflow-relay-" + identity + "-" + shard
}

// CheckpointKey is the key of shard's checkpoint records for identity.
func CheckpointKey(identity, shard string) string { return checkpointKey(identity, shard) }

// CurrentPlace reads where the database the handle points to lives.
func CurrentPlace(ctx context.Context, db dbtx.DB) (Place, error) {
	var p Place
	if err := db.QueryRow(ctx, qPlaceOID).Scan(&p.DatabaseOID); err != nil {
		return p, fmt.Errorf("read database oid: %w", err)
	}
	// pg_control_system() is executable by every role in a stock
	// PostgreSQL; a platform that revokes it leaves the cluster unknown and
	// the oid alone tells copies apart.
	var sys *string
	err := db.QueryRow(ctx, qPlaceCluster).Scan(&sys)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && (pe.Code == "42501" || pe.Code == "42883"):
	case err != nil:
		return p, fmt.Errorf("read cluster system identifier: %w", err)
	case sys != nil:
		p.ClusterSystemID = *sys
	}
	return p, nil
}

// ReadIdentity returns the database's identity.
func ReadIdentity(ctx context.Context, db dbtx.DB) (Identity, error) {
	id, err := scanIdentity(db.QueryRow(ctx, qIdentity))
	if errors.Is(err, pgx.ErrNoRows) {
		return id, ErrNoIdentity
	}
	return id, err
}

// ErrNoIdentity means onceflow.database_identity is missing or empty: the
// migrations have not run (`relay migrate`).
var ErrNoIdentity = errors.New("onceflow.database_identity is empty: run `relay migrate`")

func scanIdentity(row pgx.Row) (Identity, error) {
	var id Identity
	var sys, by, note *string
	err := row.Scan(&id.ID, &id.CreatedAt, &sys, &id.Place.DatabaseOID, &id.FirstUsedAt, &id.ChangedAt, &by, &note)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" {
			return id, ErrNoIdentity
		}
		return id, err
	}
	id.Place.ClusterSystemID = deref(sys)
	id.ChangedBy, id.ChangeNote = deref(by), deref(note)
	return id, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// bindIdentity returns the identity the relay may publish under, after
// checking that it belongs here:
//   - same place: it is ours (and now used);
//   - another place, never used: a fresh copy of a database whose relay
//     never ran (e.g. a database made from a migrated template): it gets a
//     new identity of its own;
//   - another place, used: a copy or a move, which only an operator can
//     tell apart; an *IdentityError says how.
func bindIdentity(ctx context.Context, db dbtx.DB) (id Identity, reminted bool, err error) {
	here, err := CurrentPlace(ctx, db)
	if err != nil {
		return id, false, err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		id, err = scanIdentity(tx.QueryRow(ctx, qIdentity+" FOR UPDATE"))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNoIdentity
		}
		if err != nil {
			return err
		}
		switch {
		case id.Place.Same(here):
			if id.FirstUsedAt == nil {
				_, err = tx.Exec(ctx, qIdentityUsed)
			}
			return err
		case id.FirstUsedAt == nil:
			reminted = true
			id, err = scanIdentity(tx.QueryRow(ctx, qIdentityRemint, nullIfEmpty(here.ClusterSystemID), here.DatabaseOID))
			return err
		default:
			return &IdentityError{
				Problem: fmt.Sprintf("database identity %s belongs to %s, but this is %s: the database was copied or moved (restore, dump and restore, pg_upgrade, CREATE DATABASE … TEMPLATE)",
					id.ID, id.Place, here),
				Fix: "if this database replaces the original (moved, upgraded, restored in its place), run `relay identity adopt -note …`; " +
					"if it is a separate copy that must publish on its own, run `relay identity reset -note …` (docs/relay.md, \"Restored or copied databases\")",
			}
		}
	})
	return id, reminted, err
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// AdoptIdentity records that this database replaces the one its identity
// was made in (moved, upgraded, restored in its place): the relay publishes
// under the same identity and uses its checkpoint, still checked row by row.
func AdoptIdentity(ctx context.Context, db dbtx.DB, note string) (Identity, error) {
	here, err := CurrentPlace(ctx, db)
	if err != nil {
		return Identity{}, err
	}
	id, err := scanIdentity(db.QueryRow(ctx, qIdentityAdopt, nullIfEmpty(here.ClusterSystemID), here.DatabaseOID, note))
	if errors.Is(err, pgx.ErrNoRows) {
		return id, ErrNoIdentity
	}
	return id, err
}

// ResetIdentity gives this database a new identity: its relay no longer
// uses (or fences) anything of the old one, and starts with no checkpoint.
// Rows the old identity's last transaction published but had not marked
// are published again (consumers drop them as duplicates by event id).
// Unsettled legacy checkpoints are discarded with it.
func ResetIdentity(ctx context.Context, db dbtx.DB, note string) (Identity, error) {
	here, err := CurrentPlace(ctx, db)
	if err != nil {
		return Identity{}, err
	}
	var id Identity
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		id, err = scanIdentity(tx.QueryRow(ctx, qIdentityReset, nullIfEmpty(here.ClusterSystemID), here.DatabaseOID, note))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNoIdentity
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, qLegacySettleAll, "discarded by relay identity reset")
		return err
	})
	return id, err
}

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
		l.Decision, l.DecidedBy, l.Note, l.Outcome = deref(d), deref(by), deref(note), deref(out)
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
