package pgtemp

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A switchover and back: the standby has every row the primary committed
// before its clean stop, takes writes once promoted, and the former
// primary, rebuilt, follows it.
func TestSwitchover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a, err := StartWithOptions(ctx, Options{Settings: StandbySettings()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	exec := func(c *Cluster, sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	count := func(c *Cluster) int {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	exec(a, `CREATE TABLE t (n int)`)
	b, err := a.StartStandby(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	exec(a, `INSERT INTO t SELECT generate_series(1, 1000)`)
	if err := a.StopServer(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	lsn, err := a.CheckpointLSN(ctx)
	if err != nil || lsn == "" {
		t.Fatalf("checkpoint LSN %q: %v", lsn, err)
	}
	if err := b.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(b); n != 1000 {
		t.Fatalf("the promoted standby has %d of 1000 rows", n)
	}
	exec(b, `INSERT INTO t VALUES (1001)`)
	how, err := a.Rebuild(ctx, b)
	if err != nil {
		t.Fatalf("rebuild (%s): %v", how, err)
	}
	t.Logf("former primary rebuilt by %s", how)
	exec(b, `INSERT INTO t VALUES (1002)`)
	for deadline := time.Now().Add(30 * time.Second); count(a) != 1002; {
		if time.Now().After(deadline) {
			t.Fatalf("the rebuilt standby has %d of 1002 rows", count(a))
		}
		time.Sleep(100 * time.Millisecond) // polling replication
	}
	// Writes are refused on the standby.
	conn, err := pgx.Connect(ctx, a.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO t VALUES (0)`); err == nil {
		t.Fatal("the rebuilt former primary took a write")
	}
	// And back: b stops, a is promoted, b follows a.
	if err := b.StopServer(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	if err := a.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	exec(a, `INSERT INTO t VALUES (1003)`)
	if how, err := b.Rebuild(ctx, a); err != nil {
		t.Fatalf("rebuild b (%s): %v", how, err)
	}
	exec(a, `INSERT INTO t VALUES (1004)`)
	for deadline := time.Now().Add(30 * time.Second); count(b) != 1004; {
		if time.Now().After(deadline) {
			t.Fatalf("b, the standby again, has %d of 1004 rows", count(b))
		}
		time.Sleep(100 * time.Millisecond) // polling replication
	}
}
