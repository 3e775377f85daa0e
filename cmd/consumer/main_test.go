package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
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
		{"gaps subcommand", []string{"gaps", "purge"}, `unknown command "purge"`},
		{"gaps resolve range", []string{"gaps", "resolve", "src", "9-7", "-note", "x"}, `range "9-7"`},
		{"gaps resolve note", []string{"gaps", "resolve", "src", "7-9"}, "-note (ONCEFLOW_NOTE)"},
		{"handlers file", append([]string{"run"}, base...), "-handlers-file (ONCEFLOW_HANDLERS_FILE)"},
		{"bad flag", []string{"run", "-nope"}, "flag provided but not defined"},
		{"replay without id", []string{"dlq", "replay", "-database-url", "postgres://u@localhost/db", "-handlers-file", "/dev/null"}, "EVENT-ID"},
		{"dlq subcommand", []string{"dlq", "purge"}, `unknown command "purge"`},
		{"admin without tokens", append(append([]string{"run"}, base...), "-admin"), "-admin-token-file (ONCEFLOW_ADMIN_TOKEN_FILE) is required"},
		{"admin addr", append(append([]string{"run"}, base...), "-admin", "-admin-token-file", "/x", "-admin-addr", "9091"), "-admin-addr (ONCEFLOW_ADMIN_ADDR)"},
		{"dlq list group-by", []string{"dlq", "list", "-database-url", "postgres://u@localhost/db", "-group-by", "type"}, "-group-by (ONCEFLOW_GROUP_BY)"},
		{"dlq list filter", []string{"dlq", "list", "-database-url", "postgres://u@localhost/db", "-since", "yesterday"}, `since "yesterday"`},
		{"dlq replay two ids", []string{"dlq", "replay", "-database-url", "postgres://u@localhost/db", "-handlers-file", "/dev/null", "a", "b"}, "at most one EVENT-ID"},
		{"replay gap timeouts", []string{"dlq", "replay", "-database-url", "postgres://u@localhost/db", "-handlers-file", "/dev/null", "-gap-timeouts", "x", "e1"}, "-gap-timeouts (ONCEFLOW_GAP_TIMEOUTS)"},
		{"replay max parked", []string{"dlq", "replay", "-database-url", "postgres://u@localhost/db", "-handlers-file", "/dev/null", "-max-parked", "0", "e1"}, "-max-parked (ONCEFLOW_MAX_PARKED)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tc.args, &out, &errOut)
			var ue *usageError
			if !errors.As(err, &ue) {
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
