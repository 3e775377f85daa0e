package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
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
	// Each part and the figures it must produce. A run of a subset
	// (-run 'TestBenchSmoke/parts/write') checks the figures of what ran.
	parts := []struct {
		name string
		run  func(t *testing.T)
		want []string
	}{
		{"relay", func(t *testing.T) { relayDrain(t, rep, sz.RelayEvents, false) },
			[]string{"ceiling: raw franz-go transactional produce", "relay drain (mark)"}},
		{"shards", func(t *testing.T) {
			one := relayShardsDrain(t, rep, sz.RelayEvents, 1, 0)
			relayShardsDrain(t, rep, sz.RelayEvents, 2, one)
		}, []string{"relay drain, 1 shard(s) (mark)", "relay drain, 2 shard(s) (mark)", "relay drain, 2 shard(s): CPU per 1M events: relays"}},
		{"enqueue", func(t *testing.T) { relaySourceThroughput(t, rep, sz.EnqueueFor) },
			[]string{"ceiling: Postgres single-row commits", "enqueue, 1 event/txn, 16 source(s)"}},
		{"consumer", func(t *testing.T) { consumerDrain(t, rep, sz.ConsumerEvents, false) },
			[]string{"ceiling: raw franz-go consume", "ceiling: raw batched inbox insert", "consumer drain (sql upsert handler)",
				"ceiling: inbox insert + sql handler statement", "consumer drain (sql upsert handler) vs raw inbox insert"}},
		{"slow-handler", func(t *testing.T) {
			for _, s := range slowHandlerSizes(t, true) {
				slowHandler(t, rep, s)
			}
		}, []string{"slow handler 200ms: today (concurrency 1)", "slow handler 200ms: concurrency 100", "slow handler 200ms: PostgreSQL connections in use"}},
		{"pipeline", func(t *testing.T) { pipeline(t, rep, sz) },
			[]string{"pipeline drain", "peak RSS: relay binary, pipeline run", "peak RSS: consumer binary, pipeline run", "CPU per 1M events: relay", "CPU per 1M events: consumer", "CPU per 1M events: postgres", "CPU per 1M events: kafka",
				"e2e latency @ 1000 ev/s p50", "e2e latency @ 1000 ev/s p99", "e2e latency @ 1000 ev/s p99.9", "(50% of max) p99",
				"e2e latency @ 1000 ev/s p99, split: producer", "e2e latency @ 1000 ev/s p99, split: relay read", "e2e latency @ 1000 ev/s p99, split: Kafka",
				"e2e latency @ 1000 ev/s p99, split: consumer"}},
		{"growth-consumer", func(t *testing.T) { consumerGrowth(t, rep, sz.GrowthEvents, sz.InboxRows) },
			[]string{"consumer drain, empty inbox", "growth: consumer drain", "growth: raw batched inbox insert"}},
		{"consumer-names", func(t *testing.T) { consumerNames(t, rep, sz.GrowthEvents, sz.OtherNames, false) },
			[]string{"consumer drain, its consumer name alone in the database", "consumer drain beside 3 other consumer names"}},
		// Two events per source, so that each source has a pair to swap.
		{"consumer-names-swapped", func(t *testing.T) { consumerNames(t, rep, 2*benchSources, sz.OtherNames, true) },
			[]string{"consumer drain, its consumer name alone in the database, each source's events in swapped pairs",
				"consumer drain beside 3 other consumer names, each source's events in swapped pairs"}},
		{"growth-relay", func(t *testing.T) { relayGrowth(t, rep, sz) },
			[]string{"relay drain, 500 pending", "growth: relay drain"}},
		{"write", func(t *testing.T) { writePath(t, rep, sz.WriteTxns, sz.WriteTxnEvents) },
			[]string{"ceiling: write path: plain batched INSERT", "write path: EnqueueBatch", "write path: SQL function onceflow.enqueue,", "write path: SQL function onceflow.enqueue_batch",
				"write path: outbox rows set-based naming no seq", "write path: outbox copy with its primary key only",
				"write path: outbox rows set-based, the seq triggers off"}},
		{"memory", func(t *testing.T) { memory(t, rep, sz.MemorySmall, sz.MemoryEvents) },
			[]string{"peak RSS: relay binary draining 200 events", "peak RSS: relay binary draining 2000 events",
				"peak RSS: consumer binary draining 200 events", "peak RSS: consumer binary draining 2000 events"}},
		{"peers", func(t *testing.T) { peers(t, rep, sz.PeerEvents, sz.WatermillEvents) },
			[]string{"peers: onceflow relay drain, default (mark) mode", "peers: onceflow relay drain, -delete-on-publish",
				"peers: Watermill SQL forwarder", "peers: Debezium Postgres connector", "peers: onceflow default mode vs Watermill",
				"peers: onceflow default mode vs Debezium", "peers: onceflow -delete-on-publish vs Debezium"}},
		{"relay-latency-peer", func(t *testing.T) { relayLatencyPeer(t, rep, 200, 2) },
			[]string{"relay commit-to-visible p99 at 200 ev/s for 2 s, onceflow beside Debezium"}},
		{"relay-designs", func(t *testing.T) { relayDesigns(t, rep, sz.RelayDesignBatches) },
			[]string{"relay design: mark", "relay design: delete", "relay design: move", "relay design: queue"}},
		{"snapshot", func(t *testing.T) { consumerHeldSnapshot(t, rep, sz.SnapshotEvents) },
			[]string{"consumer drain, no snapshot held", "held snapshot: consumer drain"}},
		{"snapshot-relay", func(t *testing.T) { relayHeldSnapshot(t, rep, sz.SnapshotRelayRows) },
			[]string{"relay drain, no snapshot held", "held snapshot: relay drain"}},
		{"snapshot-producer", func(t *testing.T) { producerHeldSnapshot(t, rep, sz.SnapshotProducerEvents) },
			[]string{"producer enqueue, no snapshot held", "held snapshot: producer enqueue"}},
		{"retention", func(t *testing.T) {
			full := retentionPass(t, rep, sz.RetentionRows, 500*time.Millisecond, 0)
			retentionPass(t, rep, sz.RetentionRows, 500*time.Millisecond, full/2)
		}, []string{"retention: a pass expiring", "retention: consumer apply rate during the pass, as fast", "retention: consumer apply rate during the pass, offered half"}},
		{"tracing", func(t *testing.T) { tracingOverhead(t, rep, sz) },
			[]string{"tracing off: enqueue", "tracing default (global provider, no SDK): enqueue", "tracing on, 1 trace in 10 sampled: enqueue",
				"tracing on, every span exported: enqueue", "tracing off: consumer drain", "tracing on, every span exported: consumer drain",
				"tracing on, every span exported: consumer CPU per event"}},
	}
	var mu sync.Mutex
	var want []string
	t.Run("parts", func(t *testing.T) {
		for _, p := range parts {
			t.Run(p.name, func(t *testing.T) {
				t.Parallel()
				mu.Lock()
				want = append(want, p.want...)
				mu.Unlock()
				p.run(t)
			})
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
