package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchSmoke runs the whole harness with tiny sizes (make bench-smoke;
// part of make test) and checks that every figure was produced: present,
// finite and non-zero. It asserts nothing about the values.
func TestBenchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL and Kafka (make test-short runs only the unit tests)")
	}
	sz := smokeSizes()
	rep := newReport()
	rep.setSizes(sz)
	t.Run("parts", func(t *testing.T) {
		for name, part := range map[string]func(t *testing.T){
			"relay":    func(t *testing.T) { relayDrain(t, rep, sz.RelayEvents, false) },
			"enqueue":  func(t *testing.T) { relaySourceThroughput(t, rep, sz.EnqueueFor) },
			"consumer": func(t *testing.T) { consumerDrain(t, rep, sz.ConsumerEvents, false) },
			"pipeline": func(t *testing.T) { pipeline(t, rep, sz) },
			"growth-consumer": func(t *testing.T) {
				consumerGrowth(t, rep, sz.GrowthEvents, sz.InboxRows)
			},
			"growth-relay": func(t *testing.T) { relayGrowth(t, rep, sz) },
			"tracing":      func(t *testing.T) { tracingOverhead(t, rep, sz) },
		} {
			t.Run(name, func(t *testing.T) { t.Parallel(); part(t) })
		}
	})
	if t.Failed() {
		return
	}
	rep.finish()
	var table bytes.Buffer
	rep.printTable(&table)
	t.Log(table.String())
	path := filepath.Join(t.TempDir(), "latest.json")
	if err := rep.writeJSON(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("results JSON: %v", err)
	}
	want := []string{
		"ceiling: raw franz-go transactional produce", "relay drain (mark)",
		"ceiling: Postgres single-row commits", "enqueue, 1 event/txn, 16 source(s)",
		"ceiling: raw franz-go consume", "ceiling: raw batched inbox insert", "consumer drain (sql upsert handler)",
		"pipeline drain", "CPU per 1M events: relay", "CPU per 1M events: consumer", "CPU per 1M events: postgres", "CPU per 1M events: kafka",
		"e2e latency @ 1000 ev/s p50", "e2e latency @ 1000 ev/s p99", "e2e latency @ 1000 ev/s p99.9", "(50% of max) p99",
		"consumer drain, empty inbox", "growth: consumer drain", "growth: raw batched inbox insert", "relay drain, 500 pending", "growth: relay drain",
		"tracing off: enqueue", "tracing default (global provider, no SDK): enqueue", "tracing on, 1 trace in 10 sampled: enqueue",
		"tracing on, every span exported: enqueue", "tracing off: consumer drain", "tracing on, every span exported: consumer drain",
		"tracing on, every span exported: consumer CPU per event",
	}
	for _, w := range want {
		found := false
		for _, f := range back.Figures {
			if strings.Contains(f.Name, w) {
				found = true
			}
		}
		if !found {
			t.Errorf("no figure %q", w)
		}
	}
	for _, f := range back.Figures {
		// One process's CPU over a tiny drain can round to zero ticks.
		perProcessCPU := (strings.HasPrefix(f.Name, "CPU per 1M events: ") && f.Name != "CPU per 1M events: all four") ||
			strings.Contains(f.Name, "CPU per event")
		if (f.Value <= 0 && !perProcessCPU) || f.Value < 0 || math.IsInf(f.Value, 0) || math.IsNaN(f.Value) {
			t.Errorf("figure %q = %v, want finite and > 0", f.Name, f.Value)
		}
		if f.Ceiling != 0 && (f.Ratio <= 0 || math.IsInf(f.Ratio, 0)) {
			t.Errorf("figure %q: ratio %v", f.Name, f.Ratio)
		}
		if f.LoadStart == "" || f.LoadEnd == "" {
			t.Errorf("figure %q: no load average", f.Name)
		}
	}
}
