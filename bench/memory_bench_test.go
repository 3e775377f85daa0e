package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/testkit"
)

// BenchmarkMemory drains a small and a large backlog through a fresh relay
// binary and a fresh consumer binary each (default flags, 256 B payloads;
// the consumer's topic is filled by the relay, see relayFill)
// and reports each process's peak resident set (VmHWM from
// /proc/<pid>/status) after the drain. Memory must be bounded by
// configuration (batch and fetch limits), not by the backlog: the large
// backlog's peak over the small one's is the figure.
//
// Sizes: ONCEFLOW_BENCH_MEMORY_SMALL (10k) and ONCEFLOW_BENCH_MEMORY_EVENTS
// (1M; about four minutes of the run here: the backlog insert, the topic
// prefill and both drains).
func BenchmarkMemory(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	memory(b, benchReport, sz.MemorySmall, sz.MemoryEvents)
}

func memory(tb testing.TB, rep *report, small, big int) {
	for _, bin := range []string{"relay", "consumer"} {
		peak := map[int]float64{}
		for _, n := range []int{small, big} {
			record := rep.measure()
			var mib float64
			var took time.Duration
			if bin == "relay" {
				mib, took = relayPeakRSS(tb, n)
			} else {
				mib, took = consumerPeakRSS(tb, n)
			}
			peak[n] = mib
			f := figure{Name: fmt.Sprintf("peak RSS: %s binary draining %d events", bin, n), Value: mib, Unit: "MiB",
				Notes: []string{fmt.Sprintf("VmHWM of a fresh process after draining a backlog of %d events of %d B with default flags (drain %s)", n, benchPayload, took.Round(time.Millisecond))}}
			limit := map[string]float64{"relay": 100, "consumer": 200}[bin]
			f.Target, f.Met = fmt.Sprintf("<= %.0f MiB", limit), met(mib <= limit)
			if n == big {
				f.CeilingName, f.Ceiling = fmt.Sprintf("peak with %d", small), peak[small]
				f.Target, f.Met = fmt.Sprintf("<= %.0f MiB and <= 1.2x the %d-event peak", limit, small), met(mib <= limit && mib <= 1.2*peak[small])
			}
			record(f)
		}
	}
}

// relayPeakRSS drains a backlog of n rows with a fresh relay binary and
// returns its VmHWM in MiB and the drain time.
func relayPeakRSS(tb testing.TB, n int) (float64, time.Duration) {
	ctx := context.Background()
	db := testkit.NewDB(tb)
	topic := testkit.Topic(tb, "bench-mem-relay", benchPartitions, nil)
	ckpt := testkit.Topic(tb, "bench-mem-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, payload)
		SELECT 'ev-' || g, $1, 'src-' || (g % 256), g / 256 + 1, 'bench.event', 'application/json',
		       convert_to('{"pad":"' || repeat('x', $3 - 10) || '"}', 'UTF8')
		  FROM generate_series(0, $2 - 1) g`, topic, n, benchPayload); err != nil {
		tb.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE onceflow.outbox`); err != nil {
		tb.Fatal(err)
	}
	t0 := time.Now()
	p := testkit.Start(tb, "relay", testkit.Binary(tb, "relay"), nil, "run",
		"-database-url", db.URL, "-kafka-brokers", testkit.KafkaBrokers(tb), "-checkpoint-topic", ckpt,
		"-transactional-id-prefix", "bench-"+topic+"-", "-http-addr", "127.0.0.1:0")
	addr := httpAddr(tb, p)
	waitMetric(tb, p, addr, "onceflow_relay_published_total", float64(n), 30*time.Minute)
	took := time.Since(t0)
	mib := vmHWM(tb, p.Cmd.Process.Pid)
	stopProc(tb, p)
	return mib, took
}

// consumerPeakRSS drains a topic of n events with a fresh consumer binary
// (the sql upsert handler) and returns its VmHWM in MiB and the drain time.
func consumerPeakRSS(tb testing.TB, n int) (float64, time.Duration) {
	ctx := context.Background()
	db := testkit.NewDB(tb)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.bench_state (source text PRIMARY KEY, seq bigint NOT NULL, n bigint NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	topic := relayFill(tb, db, n)
	handlers := filepath.Join(tb.TempDir(), "handlers.json")
	spec := `{"handlers": [{"event_type": "*", "kind": "sql", "sql":
		"INSERT INTO public.bench_state (source, seq, n) VALUES (:source, :seq, 1) ON CONFLICT (source) DO UPDATE SET seq = EXCLUDED.seq, n = bench_state.n + 1 WHERE bench_state.seq < EXCLUDED.seq"}]}`
	if err := os.WriteFile(handlers, []byte(spec), 0o600); err != nil {
		tb.Fatal(err)
	}
	t0 := time.Now()
	p := testkit.Start(tb, "consumer", testkit.Binary(tb, "consumer"), nil, "run",
		"-database-url", db.URL, "-kafka-brokers", testkit.KafkaBrokers(tb), "-group", "bench-"+topic, "-topics", topic,
		"-handlers-file", handlers, "-http-addr", "127.0.0.1:0")
	addr := httpAddr(tb, p)
	waitMetric(tb, p, addr, "onceflow_consumer_processed_total", float64(n), 30*time.Minute)
	took := time.Since(t0)
	mib := vmHWM(tb, p.Cmd.Process.Pid)
	stopProc(tb, p)
	return mib, took
}

var httpListening = regexp.MustCompile(`"msg":"http listening","addr":"([^"]+)"`)

// httpAddr waits for a binary's "http listening" log line and returns the
// address.
func httpAddr(tb testing.TB, p *testkit.Proc) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	line, err := p.WaitFor(ctx, httpListening)
	if err != nil {
		tb.Fatalf("%s: no http address: %v\n%s", p.Name, err, p.Output())
	}
	return httpListening.FindStringSubmatch(line)[1]
}

// scrape sums the samples of a metric on a binary's /metrics.
func scrape(addr, metric string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		rest, ok := strings.CutPrefix(l, metric)
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q: %v", metric, l, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// waitMetric polls a binary's metric every 50ms until it reaches n.
func waitMetric(tb testing.TB, p *testkit.Proc, addr, metric string, n float64, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, err := scrape(addr, metric)
		if err == nil && v >= n {
			return
		}
		if p.Exited() || time.Now().After(deadline) {
			tb.Fatalf("%s: %s reached %v of %v (%v)\n%s", p.Name, metric, v, n, err, p.Output())
		}
		time.Sleep(50 * time.Millisecond) // polling a condition
	}
}

// vmHWM is the peak resident set of pid in MiB.
func vmHWM(tb testing.TB, pid int) float64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				tb.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb / 1024
		}
	}
	tb.Fatalf("/proc/%d/status: no VmHWM", pid)
	return 0
}

func stopProc(tb testing.TB, p *testkit.Proc) {
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(30 * time.Second); err != nil {
		tb.Logf("%s: %v", p.Name, err)
	}
}

// relayFill fills a new topic the way onceflow fills topics: n rows
// bulk-inserted into the outbox and published by an in-process relay
// (transactions of 1000 over 4 partitions), and returns it. The payloads
// are hex digits (256 B), which compress about as much as real data: a fetch
// limit counts compressed bytes, and the throughput benchmarks' 'x' padding
// compresses about thirtyfold, which would make every fetch thirty times
// larger in memory than the same limit with real payloads.
func relayFill(tb testing.TB, db *testkit.DB, n int) string {
	tb.Helper()
	ctx := context.Background()
	topic := testkit.Topic(tb, "bench-mem-consumer", benchPartitions, nil)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, payload)
		SELECT 'ev-' || g, $1, 'src-' || (g % 1000), g / 1000 + 1, 'bench.event', 'application/json',
		       convert_to('{"pad":"' || left(md5(g::text) || md5(g::text || 'a') || md5(g::text || 'b') || md5(g::text || 'c')
		           || md5(g::text || 'd') || md5(g::text || 'e') || md5(g::text || 'f') || md5(g::text || 'g'), $3 - 10) || '"}', 'UTF8')
		  FROM generate_series(0, $2 - 1) g`, topic, n, benchPayload); err != nil {
		tb.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	stop := startBenchRelay(tb, db, relayBenchBatch, true, false, reg)
	waitCounter(tb, reg, "onceflow_relay_published_total", 0, float64(n), 30*time.Minute)
	stop()
	return topic
}
