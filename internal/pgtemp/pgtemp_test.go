package pgtemp

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

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

// A process that dies without Stop leaves no server behind when it asked
// for the watchdog.
func TestWatchdogStopsServerOfDeadProcess(t *testing.T) {
	if os.Getenv("PGTEMP_WATCHDOG_CHILD") != "" {
		c, err := StartWithOptions(context.Background(), Options{StopWithProcess: true})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(2)
		}
		fmt.Printf("dir=%s\nport=%d\n", c.Dir(), c.Port)
		os.Exit(0) // no Stop: the watchdog must clean up
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWatchdogStopsServerOfDeadProcess$")
	cmd.Env = append(os.Environ(), "PGTEMP_WATCHDOG_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		// os.Exit(0) in a test binary is reported as a failure by newer
		// Go versions; the output says what happened.
		t.Logf("child: %v", err)
	}
	var dir string
	var port int
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "dir="); ok {
			dir = v
		}
		if v, ok := strings.CutPrefix(l, "port="); ok {
			port, _ = strconv.Atoi(v)
		}
	}
	if dir == "" || port == 0 {
		t.Fatalf("child printed no cluster:\n%s", out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, statErr := os.Stat(dir)
		conn, dialErr := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if dialErr == nil {
			conn.Close()
		}
		if os.IsNotExist(statErr) && dialErr != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("60s after the child died: dir %s stat %v, port %d dial %v", dir, statErr, port, dialErr)
		}
		time.Sleep(100 * time.Millisecond) // polling for the watchdog's work
	}
}
