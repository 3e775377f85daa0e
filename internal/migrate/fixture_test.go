package migrate_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/migrations"
)

// migrationFixture is what a test of one migration carrying rows starts
// from: an empty database, the version of the migration named, a
// connection of its own to migrate with, and two shorthands on the pool
// that fail the test on an error.
type migrationFixture struct {
	db      *testkit.DB
	version int32
	conn    *pgx.Conn
	exec    func(q string, args ...any)
	text    func(q string, args ...any) string
}

// newMigrationFixture sets up for the migration called name; the
// connection is closed when the test ends.
func newMigrationFixture(t *testing.T, name string) migrationFixture {
	t.Helper()
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	version := migrationVersion(t, name)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return migrationFixture{
		db: db, version: version, conn: conn,
		exec: func(q string, args ...any) {
			t.Helper()
			if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		},
		text: func(q string, args ...any) string {
			t.Helper()
			var s string
			if err := db.Pool.QueryRow(ctx, q, args...).Scan(&s); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return s
		},
	}
}

// migrationVersion is the version of the migration called name.
func migrationVersion(t *testing.T, name string) int32 {
	t.Helper()
	migs, err := migrate.Load(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		if m.Name == name {
			return int32(m.Version)
		}
	}
	t.Fatalf("no %s migration", name)
	return 0
}
