package main

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/logbuf"
	"github.com/onceflow/onceflow/pkg/relay"
)

func TestInvalidConfigNamesTheSetting(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no subcommand", nil, nil, "subcommand"},
		{"unknown subcommand", []string{"publish"}, nil, `"publish"`},
		{"missing database", []string{"run", "-kafka-brokers", "k:9092"}, nil, "-database-url (ONCEFLOW_DATABASE_URL)"},
		{"missing brokers", []string{"run", "-database-url", "postgres://x/y"}, nil, "-kafka-brokers (ONCEFLOW_KAFKA_BROKERS)"},
		{"bad duration", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092", "-lease-ttl", "0s"}, nil, "-lease-ttl"},
		{"renew too slow", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092", "-lease-renew-interval", "2s"}, nil, "-lease-renew-interval"},
		{"bad env", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092"}, map[string]string{"ONCEFLOW_BATCH_MAX_ROWS": "lots"}, "ONCEFLOW_BATCH_MAX_ROWS"},
		{"zero rows", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092", "-batch-max-rows", "0"}, nil, "-batch-max-rows"},
		{"bad set-aside retry", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092", "-retry-set-aside-after", "0s"}, nil, "-retry-set-aside-after"},
		{"zero shards", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092", "-shards", "0"}, nil, "-shards (ONCEFLOW_SHARDS) must be at least 1"},
		{"shard name with shards", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092", "-shards", "2"}, nil, `-shard (ONCEFLOW_SHARD) must be this relay's shard index 0 <= K < -shards (2) in decimal when -shards > 1, got "default"`},
		{"shard out of range", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092", "-shards", "2", "-shard", "2"}, nil, `-shard (ONCEFLOW_SHARD) must be this relay's shard index`},
		{"shard out of range by env", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092"}, map[string]string{"ONCEFLOW_SHARDS": "4", "ONCEFLOW_SHARD": "-1"}, `got "-1"`},
		{"unknown admin command", []string{"outbox", "failed", "purge"}, nil, "relay outbox failed purge"},
		{"skip without note", []string{"outbox", "failed", "skip", "42", "-database-url", "postgres://x/y"}, nil, "-note is required"},
		{"skip without id", []string{"outbox", "failed", "skip", "-note", "n", "-database-url", "postgres://x/y"}, nil, "outbox id"},
		{"retry bad id", []string{"outbox", "failed", "retry", "x1", "-database-url", "postgres://x/y"}, nil, `"x1" is not an outbox id`},
		{"admin without database", []string{"outbox", "failed", "list"}, nil, "-database-url (ONCEFLOW_DATABASE_URL)"},
		{"reset without note", []string{"identity", "reset", "-database-url", "postgres://x/y"}, nil, "-note"},
		{"legacy unknown decision", []string{"identity", "legacy", "keep", "-database-url", "postgres://x/y"}, nil, "relay identity legacy keep"},
		{"admin without tokens", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092", "-admin"}, nil, "-admin-token-file (ONCEFLOW_ADMIN_TOKEN_FILE) is required"},
		{"admin token file missing", []string{"run", "-database-url", "postgres://x/y", "-kafka-brokers", "k:9092", "-admin", "-admin-token-file", "/nonexistent/tokens"}, nil, "-admin-token-file (ONCEFLOW_ADMIN_TOKEN_FILE): read token file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			err := run(tt.args, io.Discard, io.Discard)
			if cli.ExitCode(err) != 2 {
				t.Fatalf("run(%q) = %v, want a usage error (exit 2)", tt.args, err)
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("run(%q) = %q, want one line naming %s", tt.args, err, tt.want)
			}
		})
	}
}

// -pprof-addr serves Go's profiles on an address of its own; nothing
// listens for them by default. No database or broker is needed: the relay
// retries connecting while the profile endpoint serves.
func TestPprofAddr(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var logs logbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runRelay(ctx, []string{"-database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1", "-kafka-brokers", "127.0.0.1:1",
			"-http-addr", "", "-pprof-addr", "127.0.0.1:0"}, &logs)
	}()
	re := regexp.MustCompile(`"msg":"pprof listening","addr":"([^"]+)"`)
	m, err := logs.Wait(re, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	addr := m[1]
	resp, err := http.Get("http://" + addr + "/debug/pprof/heap?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "heap profile") {
		t.Fatalf("GET heap profile: %d %.80q", resp.StatusCode, body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("runRelay: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop")
	}
	var c config
	fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if f := fs.Lookup("pprof-addr"); f == nil || f.DefValue != "" {
		t.Fatalf("-pprof-addr default %v, want empty (off)", f)
	}
}

// Every setting of relay.Config is a flag of `relay run`, the table names
// only real flags, and a flag left alone is the library's default.
func TestOutboxFlags(t *testing.T) {
	var c config
	fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := outboxFlags.Check(fs); err != nil {
		t.Fatal(err)
	}
	for _, name := range outboxFlags.Uncovered(relay.Config{}) {
		t.Errorf("relay.Config.%s has no flag in outboxFlags", name)
	}
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	got, want := c.outbox, relay.Config{}.WithDefaults()
	want.HolderID, want.Logger = "", nil // generated / not a flag
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("flag defaults %+v\nlibrary defaults %+v", got, want)
	}
}

// TestExitCodes: one exit-status rule for every subcommand (cli.ExitCode):
// 0 for -help, 2 for invalid usage or configuration, 1 for a failure at run
// time (here an unreachable database or cluster, or a taken port).
func TestExitCodes(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the parallel subtests
	db := []string{"-database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}
	kafka := []string{"-kafka-brokers", "127.0.0.1:1"}
	cat := func(a ...[]string) []string { return slices.Concat(a...) }
	subs := []struct {
		sub     []string
		runtime []string // flags and arguments that pass the checks and then fail at run time
	}{
		{[]string{"run"}, cat(db, kafka, []string{"-http-addr", busy.Addr().String()})},
		{[]string{"migrate"}, db},
		{[]string{"topics", "verify"}, cat(kafka, []string{"-topics-timeout", "1s"})},
		{[]string{"topics", "apply"}, cat(kafka, []string{"-topics-timeout", "1s"})},
		{[]string{"identity", "show"}, db},
		{[]string{"identity", "adopt"}, cat(db, []string{"-note", "n"})},
		{[]string{"identity", "reset"}, cat(db, []string{"-note", "n"})},
		{[]string{"identity", "legacy", "adopt"}, cat(db, []string{"-note", "n"})},
		{[]string{"identity", "legacy", "discard"}, cat(db, []string{"-note", "n"})},
		{[]string{"outbox", "failed", "list"}, db},
		{[]string{"outbox", "failed", "retry"}, cat(db, []string{"7"})},
		{[]string{"outbox", "failed", "skip"}, cat(db, []string{"7", "-note", "n"})},
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
			if c.kind == "bad database url" && s.sub[0] == "topics" {
				c.args = cat(s.runtime, []string{"-kafka-brokers", "nohost"}) // topics has no database
			}
			t.Run(name+"/"+c.kind, func(t *testing.T) {
				t.Parallel()
				err := run(cat(s.sub, c.args), io.Discard, io.Discard)
				if got := cli.ExitCode(err); got != c.want {
					t.Fatalf("relay %s %q: exit %d (%v), want %d", name, c.args, got, err, c.want)
				}
			})
		}
	}
	if err := run([]string{"nope"}, io.Discard, io.Discard); cli.ExitCode(err) != 2 {
		t.Fatalf("unknown subcommand: %v", err)
	}
}

// Per-invocation operator flags read no environment variable.
func TestOperatorFlagsReadNoEnvironment(t *testing.T) {
	t.Setenv("ONCEFLOW_NOTE", "from the environment")
	t.Setenv("ONCEFLOW_TO", "not a number")
	err := run([]string{"outbox", "failed", "skip", "42", "-database-url", "postgres://x/y"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-note is required") {
		t.Fatalf("skip without -note: %v", err)
	}
	err = run([]string{"migrate", "-database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"}, io.Discard, io.Discard)
	if cli.ExitCode(err) != 1 {
		t.Fatalf("migrate read ONCEFLOW_TO: %v", err)
	}
}

// TestUsageShowsPositionalArguments: the operator commands that take an id
// name it in their usage line.
func TestUsageShowsPositionalArguments(t *testing.T) {
	for _, sub := range []string{"retry", "skip"} {
		var out strings.Builder
		_ = run([]string{"outbox", "failed", sub, "-h"}, &out, &out)
		if want := "usage: relay outbox failed " + sub + " ID [flags]\n"; !strings.HasPrefix(out.String(), want) {
			t.Errorf("relay outbox failed %s -h: %q, want it to start with %q", sub, strings.SplitN(out.String(), "\n", 2)[0], want)
		}
	}
}
