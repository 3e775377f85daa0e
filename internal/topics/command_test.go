package topics

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/cli"
)

// Bad command lines fail before any Kafka connection, naming what is wrong.
func TestCommandRejects(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"format":1,"topics":[{"name":"x","role":"events"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no subcommand", nil, "usage: relay topics verify|apply"},
		{"flag first", []string{"-kafka-brokers", "x:1"}, "usage: relay topics verify|apply"},
		{"unknown subcommand", []string{"fix"}, `unknown subcommand "fix"`},
		{"no brokers", []string{"verify", "-kafka-brokers", ""}, "-kafka-brokers"},
		{"unknown flag", []string{"verify", "-kafka-brokers", "x:1", "-spec", "f"}, "-spec"},
		{"extra argument", []string{"verify", "-kafka-brokers", "x:1", "extra"}, `unexpected argument "extra"`},
		{"bad role", []string{"apply", "-kafka-brokers", "x:1", "-topics-roles", "audit"}, `"audit" is not events`},
		{"negative replication", []string{"verify", "-kafka-brokers", "x:1", "-topics-replication-factor", "-1"}, "-topics-replication-factor"},
		{"missing spec file", []string{"verify", "-kafka-brokers", "x:1", "-topics-spec", "/nonexistent/topics.json"}, "read topic spec"},
		{"invalid spec file", []string{"verify", "-kafka-brokers", "x:1", "-topics-spec", bad}, "topics[0] (x): partitions must be at least 1"},
		{"zero timeout", []string{"verify", "-kafka-brokers", "x:1", "-topics-timeout", "0s"}, "-topics-timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := Command(context.Background(), "relay", tc.args, &bytes.Buffer{}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Command(%q) = %v, want an error containing %q", tc.args, err, tc.want)
			}
			if cli.ExitCode(err) != 2 {
				t.Fatalf("Command(%q) = %v: exit status %d, want 2 (a usage error)", tc.args, err, cli.ExitCode(err))
			}
		})
	}
}
