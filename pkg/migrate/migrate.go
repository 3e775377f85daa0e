// Package migrate applies onceflow's embedded SQL migrations to a database:
// the `migrate` subcommand of both binaries, exported for Go programs that
// migrate at start or in their own tooling.
//
// Each migration runs in its own transaction together with the update of
// its version row (github.com/jackc/tern/v2/migrate), and the whole run
// holds a PostgreSQL advisory lock, so two pods migrating at once apply each
// step once. The role needs CREATE on the database (for the schema) and the
// right to create the objects; deploy/sql/roles.sql then grants the
// least-privilege roles what each binary needs.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	ternmigrate "github.com/jackc/tern/v2/migrate"

	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/schema"
)

// lockKey serialises migrators. It differs from tern's own lock so that the
// schema creation below is covered too; advisory locks are re-entrant within
// a session, so holding both is harmless.
const lockKey = int64(0x6f6e6365666c6f77) // "onceflow"

// takeLock takes the migrators' advisory lock, polling for it rather than
// waiting in pg_advisory_lock: a statement waiting for the lock keeps its
// snapshot open, and a migration that builds an index CONCURRENTLY
// (migration 028) waits for every older snapshot to end, so the migrator
// holding the lock and one waiting in it would deadlock (PostgreSQL then
// aborts one of them). Between tries this one holds no snapshot.
func takeLock(ctx context.Context, conn *pgx.Conn) error {
	wait := 50 * time.Millisecond
	for {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", lockKey).Scan(&got); err != nil {
			return err
		}
		if got {
			return nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// Up applies every pending migration. It is idempotent and safe to run from
// several processes at once. It returns the version before and after.
func Up(ctx context.Context, conn *pgx.Conn) (from, to int32, err error) {
	return To(ctx, conn, -1)
}

// To migrates up or down to version target; -1 means the newest.
func To(ctx context.Context, conn *pgx.Conn, target int32) (from, to int32, err error) {
	migs, err := schema.Load(migrations.FS)
	if err != nil {
		return 0, 0, err
	}
	if err := takeLock(ctx, conn); err != nil {
		return 0, 0, fmt.Errorf("take migration lock: %w", err)
	}
	defer func() {
		// Unlock on a fresh context: the caller's may be cancelled.
		_, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockKey)
		err = errors.Join(err, uerr)
	}()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS onceflow"); err != nil {
		return 0, 0, fmt.Errorf("create schema onceflow: %w", err)
	}
	m, err := ternmigrate.NewMigrator(ctx, conn, schema.VersionTable)
	if err != nil {
		return 0, 0, fmt.Errorf("prepare migrator: %w", err)
	}
	for _, mig := range migs {
		m.AppendMigration(fmt.Sprintf("%03d_%s", mig.Version, mig.Name), mig.Up, mig.Down)
	}
	from, err = m.GetCurrentVersion(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("read schema version: %w", err)
	}
	if target < 0 {
		target = int32(len(migs))
	}
	if err := m.MigrateTo(ctx, target); err != nil {
		return from, 0, fmt.Errorf("migrate to version %d: %w", target, err)
	}
	to, err = m.GetCurrentVersion(ctx)
	if err != nil {
		return from, 0, fmt.Errorf("read schema version: %w", err)
	}
	return from, to, nil
}

// Status reads the database's schema version beside the newest embedded one.
func Status(ctx context.Context, q schema.Querier) (schema.Status, error) {
	return schema.ReadStatus(ctx, q)
}
