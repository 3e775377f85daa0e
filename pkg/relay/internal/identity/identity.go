// Package identity reads and binds the database's identity
// (onceflow.database_identity): where it belongs, whether a relay may
// publish under it. The relay binds it at every recovery; the operator
// commands (package admin) read, adopt and reset it.
package identity

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

// Current reads where the database the handle points to lives.
func Current(ctx context.Context, db dbtx.DB) (Place, error) {
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

// Read returns the database's identity.
func Read(ctx context.Context, db dbtx.DB) (Identity, error) {
	id, err := Scan(db.QueryRow(ctx, QSelect))
	if errors.Is(err, pgx.ErrNoRows) {
		return id, ErrNoIdentity
	}
	return id, err
}

// MovedError is an identity used in another place than this database's:
// the database was copied or moved, which only an operator can tell apart.
type MovedError struct {
	ID            string
	Belongs, Here Place
}

func (e *MovedError) Error() string {
	return fmt.Sprintf("database identity %s belongs to %s, but this is %s", e.ID, e.Belongs, e.Here)
}

// NullIfEmpty is s, or NULL when it is empty.
func NullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// ErrNoIdentity means onceflow.database_identity is missing or empty: the
// migrations have not run (`relay migrate`).
var ErrNoIdentity = errors.New("onceflow.database_identity is empty: run `relay migrate`")

// Scan reads an identity row (qIdentityCols).
func Scan(row pgx.Row) (Identity, error) {
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
	id.Place.ClusterSystemID = Deref(sys)
	id.ChangedBy, id.ChangeNote = Deref(by), Deref(note)
	return id, nil
}

// Deref is *s, or "" for nil.
func Deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Bind returns the identity the relay may publish under, after
// checking that it belongs here:
//   - same place: it is ours (and now used);
//   - another place, never used: a fresh copy of a database whose relay
//     never ran (e.g. a database made from a migrated template): it gets a
//     new identity of its own;
//   - another place, used: a copy or a move, which only an operator can
//     tell apart: a *MovedError.
func Bind(ctx context.Context, db dbtx.DB) (id Identity, reminted bool, err error) {
	here, err := Current(ctx, db)
	if err != nil {
		return id, false, err
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		id, err = Scan(tx.QueryRow(ctx, QSelect+" FOR UPDATE"))
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
			id, err = Scan(tx.QueryRow(ctx, qIdentityRemint, NullIfEmpty(here.ClusterSystemID), here.DatabaseOID))
			return err
		default:
			return &MovedError{ID: id.ID, Belongs: id.Place, Here: here}
		}
	})
	return id, reminted, err
}
