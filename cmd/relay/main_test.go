package main

import (
	"errors"
	"io"
	"strings"
	"testing"
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
		{"unknown admin command", []string{"outbox", "failed", "purge"}, nil, "relay outbox failed purge"},
		{"skip without note", []string{"outbox", "failed", "skip", "42", "-database-url", "postgres://x/y"}, nil, "-note (ONCEFLOW_NOTE)"},
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
			var ue usageError
			if !errors.As(err, &ue) {
				t.Fatalf("run(%q) = %v, want a usage error (exit 2)", tt.args, err)
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("run(%q) = %q, want one line naming %s", tt.args, err, tt.want)
			}
		})
	}
}
