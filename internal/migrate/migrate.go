// Package migrate applies onceflow's embedded SQL migrations.
//
// The runner is github.com/jackc/tern/v2/migrate: each migration runs in its
// own transaction together with the update of its version row, and the whole
// run holds a Postgres advisory lock so that two pods cannot race. We keep
// the files in the NNN_name.up.sql / NNN_name.down.sql layout and hand them to
// tern with AppendMigration.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
	ternmigrate "github.com/jackc/tern/v2/migrate"

	"github.com/onceflow/onceflow/migrations"
)

// VersionTable is where the applied version is recorded.
const VersionTable = "onceflow.schema_version"

// lockKey serialises migrators. It differs from tern's own lock so that the
// schema creation below is covered too; advisory locks are re-entrant within
// a session, so holding both is harmless.
const lockKey = int64(0x6f6e6365666c6f77) // "onceflow"

var fileName = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.(up|down)\.sql$`)

// Migration is one numbered step.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

// Load reads and pairs the migration files of fsys, ordered by version.
// Versions must start at 1 and have no holes; every step needs an up file.
func Load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		} else if mig.Name != m[2] {
			return nil, fmt.Errorf("migration %d has two names: %q and %q", v, mig.Name, m[2])
		}
		if m[3] == "up" {
			mig.Up = string(body)
		} else {
			mig.Down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %d is missing (found %d next)", i+1, m.Version)
		}
		if m.Up == "" {
			return nil, fmt.Errorf("migration %03d_%s has no .up.sql", m.Version, m.Name)
		}
	}
	return out, nil
}

// Up applies every pending migration. It is idempotent and safe to run from
// several processes at once.
func Up(ctx context.Context, conn *pgx.Conn) (from, to int32, err error) {
	return To(ctx, conn, -1)
}

// To migrates up or down to version target; -1 means the newest.
func To(ctx context.Context, conn *pgx.Conn, target int32) (from, to int32, err error) {
	migs, err := Load(migrations.FS)
	if err != nil {
		return 0, 0, err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockKey); err != nil {
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
	m, err := ternmigrate.NewMigrator(ctx, conn, VersionTable)
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

// Latest is the newest version in the embedded migrations.
func Latest() (int32, error) {
	migs, err := Load(migrations.FS)
	if err != nil {
		return 0, err
	}
	return int32(len(migs)), nil
}
