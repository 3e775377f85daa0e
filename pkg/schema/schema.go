// Package schema knows onceflow's database schema: the embedded migrations
// (package migrations) and which of them a database has. Engines and
// binaries call Check at start so that a database nobody migrated fails at
// once with the command to run, instead of retrying "relation does not
// exist" forever. Applying migrations is package migrate's job.
package schema

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/migrations"
)

// VersionTable is where the applied version is recorded.
const VersionTable = "onceflow.schema_version"

// Querier is what Status and Check need of a PostgreSQL handle;
// *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Migration is one numbered step.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
}

var fileName = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.(up|down)\.sql$`)

// Load reads and pairs the migration files of fsys (NNN_name.up.sql and
// NNN_name.down.sql), ordered by version. Versions must start at 1 and have
// no holes; every step needs an up file.
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

// Latest is the newest version in the embedded migrations: the version this
// build of onceflow needs.
func Latest() (int32, error) {
	migs, err := Load(migrations.FS)
	if err != nil {
		return 0, err
	}
	return int32(len(migs)), nil
}

// Status is a database's schema version beside the one this build needs.
type Status struct {
	// Current is the database's version; 0 when it has no onceflow schema.
	Current int32
	// Latest is the newest embedded migration.
	Latest int32
}

// Pending is how many migrations the database lacks.
func (s Status) Pending() int32 { return max(0, s.Latest-s.Current) }

// ReadStatus reads the database's schema version. A database without the
// version table is at version 0. A role that may not read the version table
// gets ErrVersionUnreadable (deploy/sql/roles.sql grants it to every
// onceflow role).
func ReadStatus(ctx context.Context, q Querier) (Status, error) {
	latest, err := Latest()
	if err != nil {
		return Status{}, err
	}
	st := Status{Latest: latest}
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('onceflow.schema_version') IS NOT NULL`).Scan(&exists); err != nil {
		return st, fmt.Errorf("read schema version: %w", err)
	}
	if !exists {
		return st, nil
	}
	err = q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM onceflow.schema_version`).Scan(&st.Current)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return st, fmt.Errorf("%w: %s", ErrVersionUnreadable, pgErr.Message)
	}
	if err != nil {
		return st, fmt.Errorf("read schema version: %w", err)
	}
	return st, nil
}

// Check fails with ErrNotMigrated or ErrOutdated (the message names the
// command to run) when the database lacks migrations this build needs. A
// database ahead of this build passes: migrations add before they take
// away, so an older binary keeps working during a rolling upgrade. A role
// that may not read the version table passes too (nothing can be said);
// ReadStatus tells that case apart.
func Check(ctx context.Context, q Querier) error {
	st, err := ReadStatus(ctx, q)
	if errors.Is(err, ErrVersionUnreadable) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case st.Current == 0:
		return fmt.Errorf("%w: the database has no onceflow schema (this build needs version %d): run `relay migrate` or `consumer migrate` with a role that may create it (from Go: migrate.Up)", ErrNotMigrated, st.Latest)
	case st.Current < st.Latest:
		return fmt.Errorf("%w: schema onceflow is at version %d, this build needs %d (%d pending): run `relay migrate` or `consumer migrate` (from Go: migrate.Up)", ErrOutdated, st.Current, st.Latest, st.Pending())
	}
	return nil
}

// WaitReady runs Check until it passes, retrying what retrying can fix (the
// database not reachable yet) with exponential backoff up to 10 s, and
// returning at once what it cannot: ErrNotMigrated and ErrOutdated (or the
// context's error). onRetry, when set, hears each retried error and the
// wait before the next try.
func WaitReady(ctx context.Context, q Querier, onRetry func(err error, wait time.Duration)) error {
	bo := backoff.NewExponentialBackOff(backoff.WithMaxInterval(10*time.Second), backoff.WithMaxElapsedTime(0))
	for {
		err := Check(ctx, q)
		if err == nil || errors.Is(err, ErrNotMigrated) || errors.Is(err, ErrOutdated) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := bo.NextBackOff()
		if onRetry != nil {
			onRetry(err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
