package testkit

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// HoldSnapshot opens a REPEATABLE READ transaction on a connection of its
// own to url and takes its snapshot, as a long report or an idle-in-
// transaction session would: while it is open, no row version deleted or
// updated after it began can be removed in that database. release ends it;
// the test's cleanup does if release was not called.
func HoldSnapshot(t testing.TB, url string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("hold a snapshot: %v", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		_ = conn.Close(ctx)
		t.Fatalf("hold a snapshot: %v", err)
	}
	// The snapshot is taken by the transaction's first statement.
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		_ = conn.Close(ctx)
		t.Fatalf("hold a snapshot: %v", err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Rollback(ctx)
			_ = conn.Close(ctx)
		})
	}
	t.Cleanup(release)
	return release
}
