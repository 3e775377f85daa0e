package schema_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/migrate"
	"github.com/onceflow/onceflow/pkg/schema"
)

// TestCheckNamesTheCommandToRun: an empty database, one a migration behind,
// and a migrated one; each answer as a user meets it at start.
func TestCheckNamesTheCommandToRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testkit.EmptyDB(t)
	latest, err := schema.Latest()
	if err != nil || latest < 2 {
		t.Fatalf("Latest = %d, %v", latest, err)
	}

	err = schema.Check(ctx, db.Pool)
	if !errors.Is(err, schema.ErrNotMigrated) || !strings.Contains(err.Error(), "run `relay migrate`") {
		t.Fatalf("empty database: Check = %v, want ErrNotMigrated naming `relay migrate`", err)
	}

	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, _, err := migrate.To(ctx, conn, latest-1); err != nil {
		t.Fatal(err)
	}
	err = schema.Check(ctx, db.Pool)
	if !errors.Is(err, schema.ErrOutdated) || !strings.Contains(err.Error(), "1 pending") {
		t.Fatalf("one behind: Check = %v, want ErrOutdated with 1 pending", err)
	}
	st, err := migrate.Status(ctx, db.Pool)
	if err != nil || st.Current != latest-1 || st.Pending() != 1 {
		t.Fatalf("Status = %+v, %v", st, err)
	}

	from, to, err := migrate.Up(ctx, conn)
	if err != nil || from != latest-1 || to != latest {
		t.Fatalf("Up = %d→%d, %v", from, to, err)
	}
	if err := schema.Check(ctx, db.Pool); err != nil {
		t.Fatalf("migrated: Check = %v", err)
	}
	// WaitReady returns at once on a verdict it cannot fix by waiting.
	if _, err := conn.Exec(ctx, "DELETE FROM onceflow.schema_version"); err != nil {
		t.Fatal(err)
	}
	retried := 0
	err = schema.WaitReady(ctx, db.Pool, func(error, time.Duration) { retried++ })
	if !errors.Is(err, schema.ErrNotMigrated) || retried != 0 {
		t.Fatalf("WaitReady = %v after %d retries, want ErrNotMigrated at once", err, retried)
	}
}

// TestWaitReadyRetriesAnUnreachableDatabase: a database that does not answer
// yet is retried (and reported), not taken for a missing schema.
func TestWaitReadyRetriesAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	retried := 0
	err = schema.WaitReady(ctx, pool, func(err error, _ time.Duration) {
		retried++
		if retried == 2 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || retried != 2 {
		t.Fatalf("WaitReady = %v after %d retries, want the context's error after 2", err, retried)
	}
}
