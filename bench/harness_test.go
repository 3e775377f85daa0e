package bench

// The harness shared by every benchmark in this package: sizes (full for
// `make bench`, tiny for the smoke test), the results report (one table and
// bench-results/latest.json), load averages, CPU time read from /proc, and
// the small helpers the relay and consumer benchmarks both use.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/relay"
	"github.com/onceflow/onceflow/pkg/wire"
)

// sizes are the workload sizes of one run. benchSizes reads them for `make
// bench` (each has an ONCEFLOW_BENCH_* override); smokeSizes are tiny.
type sizes struct {
	RelayEvents            int           `json:"relay_events"`             // relay drain backlog
	ConsumerEvents         int           `json:"consumer_events"`          // consumer drain topic size
	ConsumerFull           bool          `json:"consumer_full"`            // also the replays and the set-based handler
	EnqueueFor             time.Duration `json:"enqueue_for_ns"`           // each enqueue / single-row commit measurement
	PipelineEvents         int           `json:"pipeline_events"`          // relay+consumer binaries drain (CPU per event)
	LatencyFor             time.Duration `json:"latency_for_ns"`           // each open-loop latency phase
	GrowthEvents           int           `json:"growth_events"`            // consumer drain with an empty and a filled inbox
	InboxRows              int           `json:"inbox_rows"`               // pre-filled inbox rows
	OtherNames             int           `json:"other_names"`              // other consumer names beside the drain (BenchmarkConsumerNames)
	RelayPending           int           `json:"relay_pending"`            // large relay backlog
	RelayWindow            int           `json:"relay_window"`             // events timed out of the large backlog
	RelayBase              int           `json:"relay_base"`               // small relay backlog, drained RelayBaseRounds times
	RelayRounds            int           `json:"relay_base_rounds"`        // rounds of the small backlog
	WriteTxns              int           `json:"write_txns"`               // write-path transactions per variant
	WriteTxnEvents         int           `json:"write_txn_events"`         // events per write-path transaction
	MemorySmall            int           `json:"memory_small"`             // small backlog of the peak-RSS figures
	MemoryEvents           int           `json:"memory_events"`            // large backlog of the peak-RSS figures
	PeerEvents             int           `json:"peer_events"`              // backlog drained by onceflow and Debezium
	WatermillEvents        int           `json:"watermill_events"`         // backlog drained by Watermill's forwarder
	RelayDesignBatches     int           `json:"relay_design_batches"`     // batches of 1000 per relay design
	TracingEvents          int           `json:"tracing_events"`           // consumer drain with tracing off and on
	SnapshotEvents         int           `json:"snapshot_events"`          // consumer drain with and without a held snapshot
	SnapshotRelayRows      int           `json:"snapshot_relay_rows"`      // relay drain with and without a held snapshot
	SnapshotProducerEvents int           `json:"snapshot_producer_events"` // producer enqueue with and without a held snapshot
	RetentionRows          int           `json:"retention_rows"`           // inbox rows one retention pass expires
}

func benchSizes(tb testing.TB) sizes {
	return sizes{
		RelayEvents:            envInt(tb, "ONCEFLOW_BENCH_RELAY_EVENTS", 200_000),
		ConsumerEvents:         envInt(tb, "ONCEFLOW_BENCH_CONSUMER_EVENTS", 500_000),
		ConsumerFull:           true,
		EnqueueFor:             3 * time.Second,
		PipelineEvents:         envInt(tb, "ONCEFLOW_BENCH_PIPELINE_EVENTS", 200_000),
		LatencyFor:             time.Duration(envInt(tb, "ONCEFLOW_BENCH_LATENCY_SECONDS", 10)) * time.Second,
		GrowthEvents:           envInt(tb, "ONCEFLOW_BENCH_GROWTH_EVENTS", 200_000),
		InboxRows:              envInt(tb, "ONCEFLOW_BENCH_INBOX_ROWS", 10_000_000),
		OtherNames:             envInt(tb, "ONCEFLOW_BENCH_OTHER_NAMES", 20),
		RelayPending:           envInt(tb, "ONCEFLOW_BENCH_RELAY_PENDING", 1_000_000),
		RelayWindow:            envInt(tb, "ONCEFLOW_BENCH_RELAY_WINDOW", 200_000),
		RelayBase:              10_000,
		RelayRounds:            5,
		WriteTxns:              envInt(tb, "ONCEFLOW_BENCH_WRITE_TXNS", 200),
		WriteTxnEvents:         1000,
		MemorySmall:            envInt(tb, "ONCEFLOW_BENCH_MEMORY_SMALL", 10_000),
		MemoryEvents:           envInt(tb, "ONCEFLOW_BENCH_MEMORY_EVENTS", 1_000_000),
		PeerEvents:             envInt(tb, "ONCEFLOW_BENCH_PEER_EVENTS", 200_000),
		WatermillEvents:        envInt(tb, "ONCEFLOW_BENCH_WATERMILL_EVENTS", 50_000),
		RelayDesignBatches:     envInt(tb, "ONCEFLOW_BENCH_RELAY_DESIGN_BATCHES", 200),
		TracingEvents:          envInt(tb, "ONCEFLOW_BENCH_TRACING_EVENTS", 50_000),
		SnapshotEvents:         envInt(tb, "ONCEFLOW_BENCH_SNAPSHOT_EVENTS", 1_000_000),
		SnapshotRelayRows:      envInt(tb, "ONCEFLOW_BENCH_SNAPSHOT_RELAY_ROWS", 1_000_000),
		SnapshotProducerEvents: envInt(tb, "ONCEFLOW_BENCH_SNAPSHOT_PRODUCER_EVENTS", 200_000),
		RetentionRows:          envInt(tb, "ONCEFLOW_BENCH_RETENTION_ROWS", 10_000_000),
	}
}

func smokeSizes() sizes {
	return sizes{
		RelayEvents: 2_000, ConsumerEvents: 2_000, EnqueueFor: 300 * time.Millisecond,
		PipelineEvents: 1_000, LatencyFor: time.Second,
		GrowthEvents: 1_000, InboxRows: 20_000, OtherNames: 3, RelayPending: 5_000, RelayWindow: 2_000, RelayBase: 500, RelayRounds: 2,
		WriteTxns: 4, WriteTxnEvents: 100, MemorySmall: 200, MemoryEvents: 2_000,
		PeerEvents: 2_000, WatermillEvents: 500, RelayDesignBatches: 3,
		TracingEvents: 1_000, SnapshotEvents: 1_000, SnapshotRelayRows: 2_000, SnapshotProducerEvents: 2_000, RetentionRows: 20_000,
	}
}

func envInt(tb testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// figure is one row of the results table.
type figure struct {
	Name        string   `json:"name"`
	Value       float64  `json:"value"`
	Unit        string   `json:"unit"`
	CeilingName string   `json:"ceiling_name,omitempty"`
	Ceiling     float64  `json:"ceiling,omitempty"`
	Ratio       float64  `json:"ratio,omitempty"`
	Target      string   `json:"target,omitempty"`
	Met         *bool    `json:"met,omitempty"`
	LoadStart   string   `json:"loadavg_start"`
	LoadEnd     string   `json:"loadavg_end"`
	Notes       []string `json:"notes,omitempty"`
}

// report collects the figures of one run.
type report struct {
	mu      sync.Mutex
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"`
	Command string    `json:"command"`
	Machine machine   `json:"machine"`
	Sizes   *sizes    `json:"sizes,omitempty"`
	Figures []figure  `json:"figures"`
}

type machine struct {
	NProc     int    `json:"nproc"`
	MemTotal  string `json:"mem_total"`
	CPUModel  string `json:"cpu_model"`
	LoadStart string `json:"loadavg_start"`
	LoadEnd   string `json:"loadavg_end"`
	// PGFsync is the test PostgreSQL's fsync setting: make bench runs it
	// on, make test off (scripts/services.sh); commit rates differ.
	PGFsync string `json:"postgres_fsync,omitempty"`
}

// benchReport is filled by the Benchmark functions; TestMain prints it and
// writes bench-results/latest.json when a benchmark ran.
var benchReport = newReport()

func newReport() *report {
	return &report{Started: time.Now().UTC(), Machine: machine{NProc: runtime.NumCPU(), MemTotal: meminfo(), CPUModel: cpuModel(), LoadStart: loadavg()}}
}

// measure marks the start of a measurement: it returns a function that
// records f with the load averages at the start and now.
func (r *report) measure() func(f figure) {
	start := loadavg()
	return func(f figure) {
		f.LoadStart, f.LoadEnd = start, loadavg()
		if f.Ceiling > 0 && f.Ratio == 0 {
			f.Ratio = f.Value / f.Ceiling
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.Figures = append(r.Figures, f)
	}
}

func (r *report) empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.Figures) == 0
}

func (r *report) setSizes(s sizes) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Sizes = &s
}

func (r *report) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Ended = time.Now().UTC()
	r.Machine.LoadEnd = loadavg()
	r.Machine.PGFsync = pgFsync()
}

// pgFsync reads fsync from the test PostgreSQL ("?" when it cannot).
func pgFsync() string {
	url := os.Getenv("ONCEFLOW_TEST_DATABASE_URL")
	if url == "" {
		return "?"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "?"
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SHOW fsync").Scan(&v); err != nil {
		return "?"
	}
	return v
}

// printTable writes the results table.
func (r *report) printTable(w io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(w, "\nonceflow benchmarks — %d CPUs, %s, %s; load avg %s → %s; PostgreSQL fsync %s\n", r.Machine.NProc, r.Machine.MemTotal, r.Machine.CPUModel, r.Machine.LoadStart, r.Machine.LoadEnd, r.Machine.PGFsync)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\tunit\tceiling\tratio\ttarget\tmet?\tload avg (start → end)\t")
	for _, f := range r.Figures {
		ceil, ratio := "", ""
		if f.Ceiling > 0 {
			ceil = human(f.Ceiling) + " (" + f.CeilingName + ")"
			ratio = fmt.Sprintf("%.2f", f.Ratio)
		}
		met := ""
		if f.Met != nil {
			met = map[bool]string{true: "met", false: "MISSED"}[*f.Met]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s → %s\t\n", f.Name, human(f.Value), f.Unit, ceil, ratio, f.Target, met, f.LoadStart, f.LoadEnd)
	}
	_ = tw.Flush()
}

func (r *report) writeJSON(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func human(v float64) string {
	switch {
	case v >= 1000:
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func met(ok bool) *bool { return &ok }

func TestMain(m *testing.M) {
	code := m.Run()
	if !benchReport.empty() {
		benchReport.finish()
		benchReport.Command = "make bench  # go test -run '^$' -bench . -benchtime 1x -timeout 60m ./bench/ (" + strings.Join(os.Args[1:], " ") + ")"
		benchReport.printTable(os.Stdout)
		if root, err := testkit.RepoRoot(); err == nil {
			path := filepath.Join(root, "bench-results", "latest.json")
			if err := benchReport.writeJSON(path); err != nil {
				fmt.Fprintf(os.Stderr, "write %s: %v\n", path, err)
				code = 1
			} else {
				fmt.Printf("results: %s\n", path)
			}
		}
	}
	os.Exit(code)
}

// loadavg is the first three fields of /proc/loadavg.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "?"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func meminfo() string {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return fmt.Sprintf("%.1f GiB RAM", float64(kb)/(1<<20))
		}
	}
	return "?"
}

// clkTck is USER_HZ, 100 on every Linux architecture Go supports.
const clkTck = 100

// procStat returns utime+stime and cutime+cstime (seconds) and the parent
// pid of pid from /proc/<pid>/stat.
func procStat(pid int) (self, children float64, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: no comm", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	n := func(k int) float64 { v, _ := strconv.ParseFloat(f[k-3], 64); return v }
	ppid, _ = strconv.Atoi(f[1])
	return (n(14) + n(15)) / clkTck, (n(16) + n(17)) / clkTck, ppid, nil
}

// cpuOf is the CPU seconds of pid alone.
func cpuOf(pid int) float64 {
	s, _, _, err := procStat(pid)
	if err != nil {
		return math.NaN()
	}
	return s
}

// postmasterPid is the pid of the PostgreSQL server pool connects to (the
// parent of any backend, e.g. this connection's), or 0 when it is not on
// this machine.
func postmasterPid(tb testing.TB, pool *pgxpool.Pool) int {
	tb.Helper()
	var backend int
	if err := pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		tb.Fatal(err)
	}
	if _, _, pm, err := procStat(backend); err == nil {
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pm)); err == nil && strings.HasPrefix(string(comm), "postgres") {
			return pm
		}
	}
	return 0
}

// cpuTree is the CPU seconds of pid, its reaped children (cutime) and its
// live children: for the postmaster, every backend and background process,
// including those that exited during the measurement.
func cpuTree(pid int) float64 {
	s, c, _, err := procStat(pid)
	if err != nil {
		return math.NaN()
	}
	total := s + c
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cs, _, pp, err := procStat(child); err == nil && pp == pid {
			total += cs
		}
	}
	return total
}

// kafkaPid finds the broker's JVM: the pid file scripts/services.sh writes,
// else a process whose command line runs kafka.Kafka. 0 if neither.
func kafkaPid() int {
	dir := os.Getenv("ONCEFLOW_RUN_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("onceflow-%d", os.Getuid()))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "kafka", "pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
				return pid
			}
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(b), "kafka.Kafka") {
			return pid
		}
	}
	return 0
}

// percentile of sorted durations (nearest rank), in milliseconds.
func percentileMs(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	k = max(0, min(k, len(sorted)-1))
	return float64(sorted[k].Microseconds()) / 1000
}

func sortedDurations(d []time.Duration) []time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s
}

// Helpers shared by the relay and consumer benchmarks.

func relayKafkaOpts(tb testing.TB) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(tb), ",")...)}
	if os.Getenv("ONCEFLOW_BENCH_KGO_DEBUG") != "" {
		// franz-go's info log names the metadata loads a retry waits for.
		opts = append(opts, kgo.WithHooks(kgoRequests{}), kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelInfo, nil)))
	}
	return opts
}

// startBenchRelay runs an in-process relay until stop; reg (may be nil)
// receives its metrics.
func startBenchRelay(tb testing.TB, db *testkit.DB, batch int, deleteOnPublish, listen bool, reg prometheus.Registerer) (stop func()) {
	tb.Helper()
	return startBenchRelayWith(tb, db, batch, deleteOnPublish, listen, reg, nil)
}

// startBenchRelayWith is startBenchRelay with the topics' wire formats
// (nil: every topic json).
func startBenchRelayWith(tb testing.TB, db *testkit.DB, batch int, deleteOnPublish, listen bool, reg prometheus.Registerer, enc *wire.Encoder) (stop func()) {
	tb.Helper()
	ckpt := testkit.Topic(tb, "bench-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	r, err := relay.New(relay.Config{
		Wire:                  enc,
		BatchMaxRows:          batch,
		CheckpointTopic:       ckpt,
		DB:                    db.Pool,
		DeleteOnPublish:       deleteOnPublish,
		Listen:                listen,
		KafkaOpts:             relayKafkaOpts(tb),
		Logger:                benchLogger(),
		Registerer:            reg,
		TransactionalIDPrefix: "bench-" + ckpt + "-",
	})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// benchLogger prints the in-process relay's warnings and errors to stderr
// (a stall in a latency phase can then be told: a lost lease, a
// transaction settled in doubt), and with ONCEFLOW_BENCH_RELAY_DEBUG set
// its per-batch timings (fetch, kafka, mark) too.
func benchLogger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("ONCEFLOW_BENCH_RELAY_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// gauge sums the counter values of metric name in reg.
func gauge(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			var s float64
			for _, m := range mf.GetMetric() {
				s += m.GetCounter().GetValue()
			}
			return s
		}
	}
	return 0
}

// waitCounter polls metric in reg every 2ms until it reaches n and returns
// when it first moved and when it reached n.
func waitCounter(tb testing.TB, reg *prometheus.Registry, metric string, from, n float64, timeout time.Duration) (first, done time.Time) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := gauge(reg, metric)
		if v > from && first.IsZero() {
			first = time.Now()
		}
		if v >= n {
			return first, time.Now()
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s reached %v of %v in %s", metric, v, n, timeout)
		}
		time.Sleep(2 * time.Millisecond) // polling a condition
	}
}

// resetTimer resets a benchmark's timer; a no-op in tests.
func resetTimer(tb testing.TB) {
	if b, ok := tb.(*testing.B); ok {
		b.ResetTimer()
	}
}

// kgoRequests prints each Kafka request of a relay's producer (key, time
// on the broker) when ONCEFLOW_BENCH_KGO_DEBUG is set: a transaction that
// stalls shows whether the broker was slow or the client waited between
// two requests.
type kgoRequests struct{}

func (kgoRequests) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e kgo.BrokerE2E) {
	fmt.Fprintf(os.Stderr, "kafka request %s key=%d write=%s broker=%s read=%s err=%v\n", time.Now().UTC().Format("15:04:05.000"), key,
		e.TimeToWrite, e.ReadWait, e.TimeToRead, e.Err())
}
