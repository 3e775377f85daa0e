package pgtemp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Switchovers back and forth, four times: after each clean stop the
// standby has every committed row, takes writes once promoted, and the
// former primary, rebuilt, follows it. Rebuild used to run pg_rewind
// first: after repeated switchovers the rewound server would not start
// ("requested timeline 3 does not contain minimum recovery point … on
// timeline 1", PostgreSQL 15), which failed this test at round 4 and the
// soak at its second switchover. A cleanly stopped former primary follows
// as it is; Rebuild tries that first and checks that the standby streams.
func TestSwitchover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
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
	primary, standby := a, b
	rows := 0
	for round := 1; round <= 4; round++ {
		exec(primary, `INSERT INTO t SELECT generate_series(1, 1000)`)
		exec(primary, `CHECKPOINT`)
		exec(primary, `INSERT INTO t SELECT generate_series(1, 1000)`)
		rows += 2000
		if err := primary.StopServer(ctx, "fast"); err != nil {
			t.Fatal(err)
		}
		if lsn, err := primary.CheckpointLSN(ctx); err != nil || lsn == "" {
			t.Fatalf("checkpoint LSN %q: %v", lsn, err)
		}
		if err := standby.Promote(ctx); err != nil {
			t.Fatal(err)
		}
		if n := count(standby); n != rows {
			t.Fatalf("round %d: the promoted standby has %d of %d rows", round, n, rows)
		}
		exec(standby, `INSERT INTO t VALUES (0)`)
		rows++
		how, err := primary.Rebuild(ctx, standby)
		if err != nil {
			t.Fatalf("round %d: rebuild: %v", round, err)
		}
		t.Logf("round %d: the former primary follows, %s", round, how)
		exec(standby, `INSERT INTO t VALUES (0)`)
		rows++
		for deadline := time.Now().Add(30 * time.Second); count(primary) != rows; {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the rebuilt standby has %d of %d rows", round, count(primary), rows)
			}
			time.Sleep(100 * time.Millisecond) // polling replication
		}
		conn, err := pgx.Connect(ctx, primary.URL)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, fmt.Sprintf(`INSERT INTO t VALUES (%d)`, -round))
		conn.Close(ctx)
		if err == nil {
			t.Fatalf("round %d: the rebuilt former primary took a write", round)
		}
		primary, standby = standby, primary
	}
}
