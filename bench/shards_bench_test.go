package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/relay"
)

// BenchmarkRelayShards drains one backlog of RelayEvents events (256 B, 256
// sources) with 1, 2 and 4 relay shards (-shards N): N in-process relays,
// each with its own lease, transactional.id and checkpoint, in the default
// (mark) mode. It reports each count's drain rate beside the 1-shard rate of
// the same run, and the CPU seconds per 1M events of the relays (this
// process), PostgreSQL and Kafka: where their sum reaches the machine's
// cores, more shards cannot drain faster.
func BenchmarkRelayShards(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	var one float64
	for _, n := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("shards=%d", n), func(b *testing.B) {
			rate := relayShardsDrain(b, benchReport, sz.RelayEvents, n, one)
			if n == 1 {
				one = rate
			}
		})
	}
}

// relayShardsDrain drains a backlog of events with shards relays and
// records the rate (beside one, the 1-shard rate, when known) and the CPU
// split. It returns the rate.
func relayShardsDrain(b testing.TB, rep *report, events, shards int, one float64) float64 {
	ctx := context.Background()
	db := testkit.NewDB(b)
	topic := testkit.Topic(b, "bench-shards", 4, nil)
	ckpt := testkit.Topic(b, "bench-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, payload)
		SELECT 'ev-' || g, $1, 'src-' || (g % 256), g / 256 + 1, 'bench.event', 'application/octet-stream',
		       decode(repeat('ab', $3), 'hex')
		  FROM generate_series(0, $2 - 1) g`, topic, events, relayBenchPayload); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE onceflow.outbox`); err != nil {
		b.Fatal(err)
	}
	cpu := func() cpuSample {
		s := cpuSample{"relays": cpuOf(os.Getpid())}
		if pm := postmasterPid(b, db.Pool); pm > 0 {
			s["postgres"] = cpuTree(pm)
		}
		if k := kafkaPid(); k > 0 {
			s["kafka"] = cpuOf(k)
		}
		return s
	}

	resetTimer(b)
	record := rep.measure()
	c0, t0 := cpu(), time.Now()
	regs := make([]*prometheus.Registry, shards)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, shards)
	var pools []*pgxpool.Pool
	started := 0
	defer func() {
		cancel()
		for range started {
			<-done
		}
		for _, p := range pools {
			p.Close()
		}
	}()
	for k := range shards {
		regs[k] = prometheus.NewRegistry()
		// A pool of its own, as a relay process has.
		pool, err := pgxpool.New(ctx, db.URL)
		if err != nil {
			b.Fatal(err)
		}
		pools = append(pools, pool)
		r, err := relay.New(relay.Config{
			BatchMaxRows:          relayBenchBatch,
			CheckpointTopic:       ckpt,
			DB:                    pool,
			KafkaOpts:             relayKafkaOpts(b),
			Logger:                benchLogger(),
			Registerer:            regs[k],
			Shard:                 map[bool]string{true: "default", false: strconv.Itoa(k)}[shards == 1],
			Shards:                shards,
			TransactionalIDPrefix: "bench-" + ckpt + "-",
		})
		if err != nil {
			b.Fatal(err)
		}
		started++
		go func() { _ = r.Run(ctx); done <- struct{}{} }()
	}
	// Progress from the relays' published counters, then one query for
	// the last batch's mark (as relayDrain does).
	deadline := time.Now().Add(30 * time.Minute)
	for {
		var sum float64
		for _, reg := range regs {
			sum += gauge(reg, "onceflow_relay_published_total")
		}
		if sum >= float64(events) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d shards published %v of %d events in 30m", shards, sum, events)
		}
		time.Sleep(2 * time.Millisecond) // polling a condition
	}
	waitMarked(b, db, topic)
	rate := float64(events) / time.Since(t0).Seconds()
	c1 := cpu()

	name := fmt.Sprintf("relay drain, %d shard(s) (mark)", shards)
	f := figure{Name: name, Value: rate, Unit: "events/s",
		Notes: []string{fmt.Sprintf("%d events of %d B over 256 sources, %d in-process relays from start-up to the last mark", events, relayBenchPayload, shards)}}
	if shards > 1 && one > 0 {
		f.CeilingName, f.Ceiling = "1 shard, same run", one
	}
	record(f)
	per := 1e6 / float64(events)
	for _, p := range []string{"relays", "postgres", "kafka"} {
		if _, ok := c1[p]; !ok {
			continue
		}
		record(figure{Name: fmt.Sprintf("relay drain, %d shard(s): CPU per 1M events: %s", shards, p), Value: (c1[p] - c0[p]) * per, Unit: "CPU s"})
	}
	if bb, ok := b.(*testing.B); ok {
		bb.StopTimer()
		bb.ReportMetric(rate, "events/s")
	}
	b.Logf("%d shard(s) drained %d events at %.0f events/s; CPU s per 1M events: relays %.1f, postgres %.1f, kafka %.1f",
		shards, events, rate, (c1["relays"]-c0["relays"])*per, (c1["postgres"]-c0["postgres"])*per, (c1["kafka"]-c0["kafka"])*per)
	return rate
}
