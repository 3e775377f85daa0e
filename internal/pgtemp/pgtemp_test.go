package pgtemp

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestStartStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		_ = c.Stop()
		t.Fatal(err)
	}
	var one int
	err = conn.QueryRow(ctx, "SELECT 1").Scan(&one)
	conn.Close(ctx)
	if err != nil || one != 1 {
		t.Fatalf("SELECT 1: %d %v", one, err)
	}
	dir := c.Dir()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s left behind after Stop", dir)
	}
}

// An immediate stop loses no committed row, and the server comes back on
// the same port with the extra settings still applied.
func TestStopImmediateAndStartAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := StartWithOptions(ctx, Options{Settings: map[string]string{"max_connections": "123"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)`)
	if err := c.StopServer(ctx, "immediate"); err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.Connect(ctx, c.URL); err == nil {
		t.Fatal("connected to a stopped server")
	}
	if err := c.StartServer(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	var maxConns string
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM kept), current_setting('max_connections')`).Scan(&n, &maxConns); err != nil {
		t.Fatal(err)
	}
	if n != 1 || maxConns != "123" {
		t.Fatalf("after restart: %d rows, max_connections %s; want 1 and 123", n, maxConns)
	}
}
