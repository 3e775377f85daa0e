package itest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// effectsTable is the side effect of the consumer tests: one row per event,
// n counts how often it was applied, so a double apply is visible.
const effectsTable = `
CREATE TABLE public.effects (
    event_id text PRIMARY KEY,
    source   text NOT NULL,
    seq      bigint NOT NULL,
    n        integer NOT NULL,
    -- the order the handler ran in (first time)
    ord      bigint GENERATED ALWAYS AS IDENTITY,
    CONSTRAINT effects_not_poison CHECK (source <> 'poison')
)`

// effectsSQL applies one event to public.effects.
const effectsSQL = `INSERT INTO public.effects (event_id, source, seq, n) VALUES (:event_id, :source, :seq, 1)
ON CONFLICT (event_id) DO UPDATE SET n = public.effects.n + 1`

// handlersFile writes the sql handler configuration used by the consumer
// tests and returns its path.
func handlersFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "handlers.json")
	body := fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "sql", "sql": %q}]}`, effectsSQL)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func sqlHandler(t *testing.T) inbox.BatchHandler {
	t.Helper()
	h, err := handlerfile.Load(handlersFile(t))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// consumerDB is a migrated test database with the effects table.
func consumerDB(t *testing.T) *testkit.DB {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	db := testkit.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), effectsTable); err != nil {
		t.Fatalf("create effects table: %v", err)
	}
	return db
}

func testEvent(source string, seq int64) envelope.Envelope {
	return envelope.Envelope{
		EventID:   fmt.Sprintf("%s-%d", source, seq),
		Source:    source,
		Seq:       seq,
		EventType: "test.happened",
		Payload:   fmt.Appendf(nil, `{"source":%q,"seq":%d}`, source, seq),
	}
}

func produce(t testing.TB, cl *kgo.Client, topic string, evs ...envelope.Envelope) {
	t.Helper()
	recs := make([]*kgo.Record, len(evs))
	for i := range evs {
		recs[i] = evs[i].Record(topic)
	}
	produceRecords(t, cl, recs...)
}

func produceRecords(t testing.TB, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Errorf("produce: %v", err)
	}
}

// engine is an in-process consumer engine with its own metrics.
type engine struct {
	c      *inbox.Consumer
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

func startEngine(t *testing.T, cfg inbox.Config) *engine {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if len(cfg.KafkaOpts) == 0 {
		cfg.KafkaOpts = []kgo.Opt{kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(t), ",")...)}
	}
	if cfg.RetryInitialInterval == 0 {
		cfg.RetryInitialInterval = 10 * time.Millisecond
		cfg.RetryMaxInterval = 50 * time.Millisecond
	}
	c, err := inbox.New(cfg)
	if err != nil {
		t.Fatalf("inbox.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &engine{c: c, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { e.done <- c.Run(ctx) }()
	t.Cleanup(func() { e.stop(t) })
	return e
}

// stop drains the engine and waits for Run to return.
func (e *engine) stop(t testing.TB) {
	t.Helper()
	if e.cancel == nil {
		return
	}
	e.cancel()
	e.cancel = nil
	select {
	case err := <-e.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Errorf("engine did not drain within 60s")
	}
}

// metric reads a counter or gauge of the engine.
func (e *engine) metric(name string) float64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
		return sum
	}
	return 0
}

// eventually polls cond until it is true or timeout passes; then it fails
// the test with what cond last reported.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, state)
		}
		<-tick.C
	}
}

func count(t testing.TB, db *testkit.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// checkEffects asserts that every event in want was applied exactly once
// and nothing else was.
func checkEffects(t testing.TB, db *testkit.DB, want map[string]bool) {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT event_id, n FROM public.effects`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	var doubled, unexpected []string
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		seen[id] = true
		if n != 1 {
			doubled = append(doubled, fmt.Sprintf("%s×%d", id, n))
		}
		if !want[id] {
			unexpected = append(unexpected, id)
		}
	}
	var lost []string
	for id := range want {
		if !seen[id] {
			lost = append(lost, id)
		}
	}
	if len(doubled)+len(unexpected)+len(lost) > 0 {
		t.Fatalf("effects: %d applied more than once %v; %d unexpected %v; %d lost %v",
			len(doubled), head(doubled), len(unexpected), head(unexpected), len(lost), head(lost))
	}
}

// checkOrdered asserts that every source's events were applied in seq
// order (public.effects.ord), that no sequence gap was given up and that no
// event was applied or held late.
func checkOrdered(t testing.TB, db *testkit.DB) {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT source, seq FROM public.effects ORDER BY ord`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	last := map[string]int64{}
	var disorder []string
	for rows.Next() {
		var src string
		var seq int64
		if err := rows.Scan(&src, &seq); err != nil {
			t.Fatal(err)
		}
		if seq <= last[src] {
			disorder = append(disorder, fmt.Sprintf("%s: %d after %d", src, seq, last[src]))
		}
		last[src] = seq
	}
	if len(disorder) > 0 {
		t.Fatalf("%d events applied out of seq order: %v", len(disorder), head(disorder))
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`); n != 0 {
		t.Fatalf("%d sequence gaps given up", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE late`); n != 0 {
		t.Fatalf("%d events applied or held late", n)
	}
}

func head(s []string) []string {
	if len(s) > 10 {
		return s[:10]
	}
	return s
}

func fmtState(kv ...any) string {
	return fmt.Sprint(kv...)
}
