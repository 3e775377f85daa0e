package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/logbuf"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// Invalid configuration fails at start with one line naming the setting and
// its environment variable, as a usage error (exit status 2).
func TestRunRejectsBadConfig(t *testing.T) {
	for _, k := range []string{"DATABASE_URL", "KAFKA_BROKERS", "GROUP", "TOPICS", "HANDLERS_FILE", "CONSUMER_NAME", "RETRY_MAX_ATTEMPTS",
		"ORDERING", "FIRST_SEEN", "LATE_POLICY", "GAP_TIMEOUTS", "GAP_TIMEOUT", "GAP_CHECK_INTERVAL", "MAX_PARKED", "NOTE",
		"ADMIN", "ADMIN_ADDR", "ADMIN_TOKEN_FILE", "GROUP_BY", "SOURCE", "ERROR", "FROM", "TO", "SINCE", "STATUS", "EVENT_TYPE", "ALL"} {
		t.Setenv("ONCEFLOW_"+k, "") // restored after the test
		os.Unsetenv("ONCEFLOW_" + k)
	}
	base := []string{"-database-url", "postgres://u@localhost/db", "-kafka-brokers", "localhost:9092", "-group", "g", "-topics", "t", "-handlers-file", "/dev/null"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "a command is required"},
		{"unknown command", []string{"nope"}, `unknown command "nope"`},
		{"database", []string{"run"}, "ONCEFLOW_DATABASE_URL"},
		{"group", append(append([]string{"run"}, base...), "-group", ""), "-group (ONCEFLOW_GROUP) is required"},
		{"topics", append(append([]string{"run"}, base...), "-topics", ""), "-topics (ONCEFLOW_TOPICS) is required"},
		{"brokers", append(append([]string{"run"}, base...), "-kafka-brokers", "nohost"), "ONCEFLOW_KAFKA_BROKERS"},
		{"retry", append(append([]string{"run"}, base...), "-retry-max-attempts", "0"), "-retry-max-attempts (ONCEFLOW_RETRY_MAX_ATTEMPTS)"},
		{"duration", append(append([]string{"run"}, base...), "-retry-max-elapsed", "-1s"), "-retry-max-elapsed (ONCEFLOW_RETRY_MAX_ELAPSED)"},
		{"ordering", append(append([]string{"run"}, base...), "-ordering", "random"), "-ordering (ONCEFLOW_ORDERING)"},
		{"first seen", append(append([]string{"run"}, base...), "-first-seen", "any"), "-first-seen (ONCEFLOW_FIRST_SEEN)"},
		{"late policy", append(append([]string{"run"}, base...), "-late-policy", "drop"), "-late-policy (ONCEFLOW_LATE_POLICY)"},
		{"gap timeouts", append(append([]string{"run"}, base...), "-gap-timeouts", "billing.*"), "-gap-timeouts (ONCEFLOW_GAP_TIMEOUTS)"},
		{"gap timeout", append(append([]string{"run"}, base...), "-gap-timeout", "0s"), "-gap-timeout (ONCEFLOW_GAP_TIMEOUT)"},
		{"gap check interval", append(append([]string{"run"}, base...), "-gap-check-interval", "-1s"), "-gap-check-interval (ONCEFLOW_GAP_CHECK_INTERVAL)"},
		{"max parked", append(append([]string{"run"}, base...), "-max-parked", "0"), "-max-parked (ONCEFLOW_MAX_PARKED)"},
		{"fetch max bytes", append(append([]string{"run"}, base...), "-fetch-max-bytes", "0"), "-fetch-max-bytes (ONCEFLOW_FETCH_MAX_BYTES)"},
		{"fetch max wait", append(append([]string{"run"}, base...), "-fetch-max-wait", "0s"), "-fetch-max-wait (ONCEFLOW_FETCH_MAX_WAIT)"},
		{"fetch partition bytes", append(append([]string{"run"}, base...), "-fetch-max-partition-bytes", "2000000"), "-fetch-max-partition-bytes (ONCEFLOW_FETCH_MAX_PARTITION_BYTES)"},
		{"gaps subcommand", []string{"gaps", "purge"}, `unknown command "purge"`},
		{"gaps resolve range", []string{"gaps", "resolve", "src", "9-7", "-note", "x"}, `range "9-7"`},
		{"gaps resolve note", []string{"gaps", "resolve", "src", "7-9"}, "-note is required"},
		{"gaps give-up range", []string{"gaps", "give-up", "src", "x-9", "-note", "x"}, `range "x-9"`},
		{"gaps give-up note", []string{"gaps", "give-up", "src", "7-9"}, "-note is required"},
		{"gaps give-up stream", []string{"gaps", "give-up", "src", "7-9", "-note", "x", "-producer", "p"}, "-producer and -topic go together"},
		{"handlers file", append([]string{"run"}, base...), "-handlers-file (ONCEFLOW_HANDLERS_FILE)"},
		{"bad flag", []string{"run", "-nope"}, "flag provided but not defined"},
		{"replay without id", []string{"dlq", "replay", "-database-url", "postgres://u@localhost/db", "-handlers-file", "/dev/null"}, "EVENT-ID"},
		{"dlq subcommand", []string{"dlq", "purge"}, `unknown command "purge"`},
		{"admin without tokens", append(append([]string{"run"}, base...), "-admin"), "-admin-token-file (ONCEFLOW_ADMIN_TOKEN_FILE) is required"},
		{"admin addr", append(append([]string{"run"}, base...), "-admin", "-admin-token-file", "/x", "-admin-addr", "9091"), "-admin-addr (ONCEFLOW_ADMIN_ADDR)"},
		{"dlq list group-by", []string{"dlq", "list", "-database-url", "postgres://u@localhost/db", "-group-by", "type"}, `-group-by "type": want error`},
		{"dlq list filter", []string{"dlq", "list", "-database-url", "postgres://u@localhost/db", "-since", "yesterday"}, `since "yesterday"`},
		{"dlq replay two ids", []string{"dlq", "replay", "-database-url", "postgres://u@localhost/db", "-handlers-file", "/dev/null", "a", "b"}, "at most one EVENT-ID"},
		{"replay gap timeouts", []string{"dlq", "replay", "-database-url", "postgres://u@localhost/db", "-handlers-file", "/dev/null", "-gap-timeouts", "x", "e1"}, "-gap-timeouts (ONCEFLOW_GAP_TIMEOUTS)"},
		{"replay max parked", []string{"dlq", "replay", "-database-url", "postgres://u@localhost/db", "-handlers-file", "/dev/null", "-max-parked", "0", "e1"}, "-max-parked (ONCEFLOW_MAX_PARKED)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, &out, &errOut)
			if cli.ExitCode(err) != 2 {
				t.Fatalf("err = %v (%T), want a usage error", err, err)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %q, want one line containing %q", err, tc.want)
			}
		})
	}
}

func TestRunEnvFallback(t *testing.T) {
	t.Setenv("ONCEFLOW_DATABASE_URL", "postgres://u@localhost/db")
	t.Setenv("ONCEFLOW_KAFKA_BROKERS", "localhost:9092")
	t.Setenv("ONCEFLOW_GROUP", "g")
	t.Setenv("ONCEFLOW_TOPICS", "a, b")
	t.Setenv("ONCEFLOW_HANDLERS_FILE", "/nonexistent/handlers.json")
	err := run(context.Background(), []string{"run"}, &bytes.Buffer{}, &bytes.Buffer{})
	// Everything else came from the environment: the handlers file is next.
	if err == nil || !strings.Contains(err.Error(), "-handlers-file (ONCEFLOW_HANDLERS_FILE): read handler file") {
		t.Fatalf("err = %v", err)
	}
}

// -pprof-addr (and ONCEFLOW_PPROF_ADDR) serves Go's profiles on an address
// of its own; off by default. No database or broker is needed: the
// consumer retries connecting while the profile endpoint serves.
func TestPprofAddr(t *testing.T) {
	handlers := filepath.Join(t.TempDir(), "handlers.json")
	if err := os.WriteFile(handlers, []byte(`{"handlers": [{"event_type": "*", "kind": "log"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ONCEFLOW_PPROF_ADDR", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	var logs logbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"run", "-database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", "-kafka-brokers", "127.0.0.1:1",
			"-group", "g", "-topics", "t", "-handlers-file", handlers, "-http-addr", ""}, &bytes.Buffer{}, &logs)
	}()
	re := regexp.MustCompile(`"msg":"pprof listening","addr":"([^"]+)"`)
	m, err := logs.Wait(re, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	addr := m[1]
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile") {
		t.Fatalf("GET goroutine profile: %d %.80q", resp.StatusCode, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("consumer run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("consumer did not stop")
	}
	var c runConfig
	fs := flag.NewFlagSet("consumer run", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if f := fs.Lookup("pprof-addr"); f == nil || f.DefValue != "" {
		t.Fatalf("-pprof-addr default %v, want empty (off)", f)
	}
}

// Every setting of inbox.Config is a flag of `consumer run` or left at the
// library's default on purpose, the table names only real flags, and a flag
// left alone is the library's default.
func TestInboxFlags(t *testing.T) {
	var c runConfig
	fs := flag.NewFlagSet("consumer run", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := inboxFlags.Check(fs); err != nil {
		t.Fatal(err)
	}
	for _, name := range inboxFlags.Uncovered(inbox.Config{}, inboxUnflagged...) {
		t.Errorf("inbox.Config.%s has no flag in inboxFlags", name)
	}
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	got, want := c.Inbox, inbox.Config{}.WithDefaults()
	want.Clock, want.Logger = nil, nil // not flags
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("flag defaults %+v\nlibrary defaults %+v", got, want)
	}
	var d dlqConfig
	fs = flag.NewFlagSet("consumer dlq replay", flag.ContinueOnError)
	d.RegisterFlags(fs, true)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if rc, err := d.replayConfig(); err != nil || rc.GapTimeout != want.GapTimeout || rc.MaxParked != want.MaxParked || rc.FirstSeen != want.FirstSeen {
		t.Fatalf("replay defaults %+v, %v", rc, err)
	}
}

// TestExitCodes: one exit-status rule for every subcommand (cli.ExitCode):
// 0 for -help, 2 for invalid usage or configuration, 1 for a failure at run
// time (here an unreachable database or a taken port).
func TestExitCodes(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the parallel subtests
	dir := t.TempDir()
	handlers := filepath.Join(dir, "handlers.json")
	retention := filepath.Join(dir, "retention.json")
	if err := os.WriteFile(handlers, []byte(`{"handlers": [{"event_type": "*", "kind": "log"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(retention, []byte(`{"classes":[{"match":"*","keep":"1h"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	db := []string{"-database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	cat := func(a ...[]string) []string { return slices.Concat(a...) }
	subs := []struct {
		sub     []string
		runtime []string // flags and arguments that pass the checks and then fail at run time
	}{
		{[]string{"run"}, cat(db, []string{"-kafka-brokers", "127.0.0.1:1", "-group", "g", "-topics", "t", "-handlers-file", handlers,
			"-http-addr", busy.Addr().String()})},
		{[]string{"migrate"}, db},
		{[]string{"prune"}, cat(db, []string{"-retention-file", retention})},
		{[]string{"dlq", "list"}, db},
		{[]string{"dlq", "replay"}, cat(db, []string{"-handlers-file", handlers, "e1"})},
		{[]string{"gaps", "list"}, db},
		{[]string{"gaps", "resolve"}, cat(db, []string{"src", "7-9", "-note", "n"})},
		{[]string{"gaps", "give-up"}, cat(db, []string{"src", "7-9", "-note", "n"})},
	}
	for _, s := range subs {
		name := strings.Join(s.sub, " ")
		for _, c := range []struct {
			kind string
			args []string
			want int
		}{
			{"help", []string{"-help"}, 0},
			{"unknown flag", []string{"-no-such-flag"}, 2},
			{"bad database url", cat(s.runtime, []string{"-database-url", "postgres://x/y?sslmode=nonsense"}), 2},
			{"run time", s.runtime, 1},
		} {
			t.Run(name+"/"+c.kind, func(t *testing.T) {
				t.Parallel()
				err := run(context.Background(), cat(s.sub, c.args), io.Discard, io.Discard)
				if got := cli.ExitCode(err); got != c.want {
					t.Fatalf("consumer %s %q: exit %d (%v), want %d", name, c.args, got, err, c.want)
				}
			})
		}
	}
	if err := run(context.Background(), []string{"nope"}, io.Discard, io.Discard); cli.ExitCode(err) != 2 {
		t.Fatalf("unknown command: %v", err)
	}
}

// Per-invocation operator flags read no environment variable: a shared
// environment that happens to set ONCEFLOW_NOTE, ONCEFLOW_SINCE or
// ONCEFLOW_TO chooses nothing for an operator's command.
func TestOperatorFlagsReadNoEnvironment(t *testing.T) {
	for k, v := range map[string]string{"NOTE": "from the environment", "SINCE": "yesterday", "TO": "not a time", "LIMIT": "0", "ALL": "maybe", "ACTOR": "env"} {
		t.Setenv("ONCEFLOW_"+k, v)
	}
	db := []string{"-database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	err := run(context.Background(), append([]string{"gaps", "resolve", "src", "7-9"}, db...), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-note is required") {
		t.Fatalf("gaps resolve without -note: %v", err)
	}
	for _, args := range [][]string{{"dlq", "list"}, {"gaps", "list"}, {"migrate"}} {
		err := run(context.Background(), append(args, db...), io.Discard, io.Discard)
		if cli.ExitCode(err) != 1 { // past the flags: the database is unreachable
			t.Fatalf("%v: %v (exit %d), want a run-time failure", args, err, cli.ExitCode(err))
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"dlq", "replay", "-help"}, &out, &out); err != nil && !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	for _, name := range []string{"note", "all", "limit", "since", "to", "actor"} {
		if !strings.Contains(out.String(), "  -"+name+"  [flag only]") {
			t.Errorf("dlq replay -help does not list -%s as flag only:\n%s", name, out.String())
		}
	}
}
