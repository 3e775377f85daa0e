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
