// Package migrate is the binaries' `migrate` subcommand (command.go) and
// the names the repository's own tests use; the runner is the public
// package pkg/migrate and the migration files' loader pkg/schema.
package migrate

import (
	"context"
	"io/fs"

	"github.com/jackc/pgx/v5"

	pkgmigrate "github.com/onceflow/onceflow/pkg/migrate"
	"github.com/onceflow/onceflow/pkg/schema"
)

// VersionTable is where the applied version is recorded.
const VersionTable = schema.VersionTable

// Migration is one numbered step.
type Migration = schema.Migration

// Load reads and pairs the migration files of fsys, ordered by version.
func Load(fsys fs.FS) ([]Migration, error) { return schema.Load(fsys) }

// Up applies every pending migration (pkg/migrate.Up).
func Up(ctx context.Context, conn *pgx.Conn) (from, to int32, err error) {
	return pkgmigrate.Up(ctx, conn)
}

// To migrates up or down to version target; -1 means the newest.
func To(ctx context.Context, conn *pgx.Conn, target int32) (from, to int32, err error) {
	return pkgmigrate.To(ctx, conn, target)
}

// Latest is the newest version in the embedded migrations.
func Latest() (int32, error) { return schema.Latest() }
