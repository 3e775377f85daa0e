package topics

import (
	"encoding/json"
	"strings"
	"testing"
)

// The spec built into the binaries parses, and keeps the rules that protect
// the key scheme.
func TestDefaultSpec(t *testing.T) {
	t.Parallel()
	s, err := Default()
	if err != nil {
		t.Fatalf("Default: %v", err)
	}
	roles := map[Role]int{}
	for _, ts := range s.Topics {
		roles[ts.Role]++
		if ts.ReplicationFactor < 3 || ts.MinInsyncReplicas < 2 {
			t.Errorf("%s: replication %d / min.insync.replicas %d is not a production default", ts.Label(), ts.ReplicationFactor, ts.MinInsyncReplicas)
		}
	}
	for _, r := range []Role{RoleEvents, RoleCheckpoint, RoleDLQ} {
		if roles[r] == 0 {
			t.Errorf("no %s topic in the default spec", r)
		}
	}
	cp, ok := s.Lookup("onceflow.relay.checkpoints")
	if !ok || cp.CleanupPolicy != "compact" || cp.Partitions != 1 {
		t.Errorf("checkpoint entry = %+v, %v; want compact with 1 partition", cp, ok)
	}
	if ts, ok := s.Lookup("onceflow.events.orders"); !ok || ts.Role != RoleEvents {
		t.Errorf("onceflow.events.orders is not governed by an events pattern: %+v", ts)
	}
	if _, ok := s.Lookup("someone.else"); ok {
		t.Errorf("an unrelated topic is governed by the spec")
	}
}

func validEntry() map[string]any {
	return map[string]any{
		"name": "t1", "role": "events", "partitions": 3, "replication_factor": 3,
		"min_insync_replicas": 2, "retention_ms": 1000, "cleanup_policy": "delete", "compression": "zstd",
	}
}

func TestParseRejects(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		mutate func(spec map[string]any, e map[string]any)
		want   string
	}{
		{"format", func(s, _ map[string]any) { s["format"] = 2 }, "format is 2"},
		{"unknown field", func(_, e map[string]any) { e["partitons"] = 3 }, `unknown field "partitons"`},
		{"name and pattern", func(_, e map[string]any) { e["pattern"] = "^x$" }, "exactly one of name and pattern"},
		{"bad name", func(_, e map[string]any) { e["name"] = "a/b" }, "not a valid Kafka topic name"},
		{"bad pattern", func(_, e map[string]any) { delete(e, "name"); e["pattern"] = "(" }, "pattern:"},
		{"partitions", func(_, e map[string]any) { e["partitions"] = 0 }, "partitions must be at least 1"},
		{"replication", func(_, e map[string]any) { e["replication_factor"] = 0 }, "replication_factor must be at least 1"},
		{"min isr over rf", func(_, e map[string]any) { e["min_insync_replicas"] = 4 }, "min_insync_replicas must be between 1 and replication_factor (3)"},
		{"retention", func(_, e map[string]any) { e["retention_ms"] = 0 }, "retention_ms must be positive or -1"},
		{"policy", func(_, e map[string]any) { e["cleanup_policy"] = "forever" }, `cleanup_policy "forever"`},
		{"compact events", func(_, e map[string]any) { e["cleanup_policy"] = "compact" }, "cleanup_policy of a events topic must be delete"},
		{"compact,delete events", func(_, e map[string]any) { e["cleanup_policy"] = "delete,compact" }, `must be delete, got "compact,delete"`},
		{"delete checkpoint", func(_, e map[string]any) { e["role"] = "checkpoint" }, "checkpoint topic must be compact"},
		{"compression", func(_, e map[string]any) { e["compression"] = "brotli" }, `compression "brotli"`},
		{"typed config", func(_, e map[string]any) { e["configs"] = map[string]string{"retention.ms": "5"} }, "retention.ms has a typed field"},
		{"role", func(_, e map[string]any) { e["role"] = "audit" }, `role "audit"`},
		{"twice", func(s, e map[string]any) { s["topics"] = []any{e, e} }, "name appears twice"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := validEntry()
			s := map[string]any{"format": 1, "topics": []any{e}}
			tc.mutate(s, e)
			b, _ := json.Marshal(s)
			_, err := Parse(b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// The development override lowers the replication factor and keeps
// min.insync.replicas satisfiable, without touching the original.
func TestWithReplicationFactor(t *testing.T) {
	t.Parallel()
	s, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	one := s.WithReplicationFactor(1)
	for i, ts := range one.Topics {
		if ts.ReplicationFactor != 1 || ts.MinInsyncReplicas != 1 {
			t.Errorf("%s: rf %d, min.insync.replicas %d after override to 1", ts.Label(), ts.ReplicationFactor, ts.MinInsyncReplicas)
		}
		if s.Topics[i].ReplicationFactor == 1 {
			t.Errorf("%s: override changed the original spec", ts.Label())
		}
	}
	if s.WithReplicationFactor(0) != s {
		t.Errorf("override 0 should return the spec unchanged")
	}
	if got := s.Select(RoleCheckpoint).Topics; len(got) != 1 || got[0].Role != RoleCheckpoint {
		t.Errorf("Select(checkpoint) = %+v", got)
	}
}
