package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// slowSize is one slow-handler row: the downstream's delay, the events of
// the concurrent run (one per source) and of today's (Concurrency 1) run.
type slowSize struct {
	Delay            time.Duration
	Events, Baseline int
}

// slowHandlerSizes are the rows of issue 33: 2,000 sources over 4
// partitions at 200 ms and at 2 s. Today's figure is measured on fewer
// events (one call at a time per partition would take minutes).
func slowHandlerSizes(tb testing.TB, smoke bool) []slowSize {
	if smoke {
		// The 2 s row is the same code with a longer delay: the smoke run
		// checks the 200 ms row's figures only.
		return []slowSize{{200 * time.Millisecond, 50, 4}}
	}
	return []slowSize{
		{200 * time.Millisecond, envInt(tb, "ONCEFLOW_BENCH_SLOW_EVENTS", 2000), 80},
		{2 * time.Second, envInt(tb, "ONCEFLOW_BENCH_SLOW_EVENTS", 2000), 16},
	}
}

// slowConcurrency is the calls in flight of the concurrent run, over all
// partitions (Concurrency is per partition).
const slowConcurrency = 100

// BenchmarkSlowHandler: the http handler against a local downstream that
// takes 200 ms (then 2 s) per call, one event per source over 4 partitions,
// at 100 calls in flight (Concurrency 25 per partition), beside today's
// figure (Concurrency 1: one call at a time per partition), with the
// PostgreSQL connections the consumer had in use at most.
func BenchmarkSlowHandler(b *testing.B) {
	for _, s := range slowHandlerSizes(b, false) {
		slowHandler(b, benchReport, s)
	}
}

func slowHandler(tb testing.TB, rep *report, s slowSize) {
	ctx := context.Background()
	var calls atomic.Int64
	var firstCall atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		firstCall.CompareAndSwap(0, time.Now().UnixNano())
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(s.Delay)
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	tb.Cleanup(srv.Close)
	srv.Config.SetKeepAlivesEnabled(true)
	file := filepath.Join(tb.TempDir(), "handlers.json")
	spec := fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "http", "http": {"url": %q, "timeout": %q}}]}`, srv.URL+"/effects", (s.Delay + 10*time.Second).String())
	if err := os.WriteFile(file, []byte(spec), 0o600); err != nil {
		tb.Fatal(err)
	}
	delay := s.Delay.String()
	// The pool's use in a run: acquires per event and the time spent
	// waiting for a connection (what bounded the claims of one statement
	// per call).
	type poolUse struct {
		acquires int64
		wait     time.Duration
		// The batch transactions' HandleBatch calls: for events whose
		// call was made before the transaction, the records of the
		// calls (effect_lease_record, one statement per event in the
		// batch's pipeline), which is all this handler does there.
		batches int64
		handle  time.Duration
	}
	run := func(n, concurrency int) (rate float64, maxConns int64, pw poolUse) {
		db := testkit.NewDB(tb)
		topic := testkit.Topic(tb, "bench-slow", benchPartitions, nil)
		cl := testkit.Client(tb, kgo.DefaultProduceTopic(topic))
		recs := make([]*kgo.Record, n)
		for i := range recs {
			ev := envelope.Envelope{EventID: fmt.Sprintf("slow-%d", i), Source: fmt.Sprintf("src-%05d", i), Seq: 1, EventType: "bench.slow",
				Payload: []byte(`{"n":1}`)}
			recs[i] = ev.Record(topic)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			tb.Fatal(err)
		}
		loaded, err := handlerfile.Load(file)
		if err != nil {
			tb.Fatal(err)
		}
		eff, ok := loaded.(effectingBatch)
		if !ok {
			tb.Fatalf("the http handler (%T) makes no effects before its transaction", loaded)
		}
		h := &timedBatch{effectingBatch: eff}
		const app = "onceflow-bench-slow"
		pc, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			tb.Fatal(err)
		}
		pc.ConnConfig.RuntimeParams["application_name"] = app
		// One connection per partition for the transactions, the rest for
		// the claims (100 claims per 200 ms, sent in groups: one statement
		// per group); the target counts those in use.
		pc.MaxConns = 8
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			tb.Fatal(err)
		}
		defer pool.Close()
		// Connections in use: the consumer's backends that are not idle.
		var peak atomic.Int64
		sctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sctx.Err() == nil {
				var n int64
				if db.Pool.QueryRow(sctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1 AND state <> 'idle'`, app).Scan(&n) == nil {
					peak.Store(max(peak.Load(), n))
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		reg := prometheus.NewRegistry()
		c, err := inbox.New(inbox.Config{BatchHandler: h, Group: "g-" + topic, Topics: []string{topic}, Pool: pool, Registerer: reg,
			Concurrency: concurrency, KafkaOpts: []kgo.Opt{kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(tb), ",")...)},
			Logger: benchLogger()})
		if err != nil {
			tb.Fatal(err)
		}
		firstCall.Store(0)
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		_, end := waitCounter(tb, reg, "onceflow_consumer_processed_total", 0, float64(n), 30*time.Minute)
		cancel()
		if err := <-done; err != nil {
			tb.Fatal(err)
		}
		stop()
		wg.Wait()
		took := end.Sub(time.Unix(0, firstCall.Load()))
		st := pool.Stat()
		pw = poolUse{acquires: st.AcquireCount(), wait: st.AcquireDuration(), batches: h.batches.Load(), handle: time.Duration(h.took.Load())}
		return float64(n) / took.Seconds(), peak.Load(), pw
	}
	perPartition := slowConcurrency / benchPartitions
	record := rep.measure()
	today, _, _ := run(s.Baseline, 1)
	record(figure{Name: fmt.Sprintf("slow handler %s: today (concurrency 1)", delay), Value: today, Unit: "events/s",
		Notes: []string{fmt.Sprintf("%d events of %d sources, %d partitions: one call at a time per partition", s.Baseline, s.Baseline, benchPartitions)}})
	record = rep.measure()
	rate, conns, pw := run(s.Events, perPartition)
	ideal := float64(slowConcurrency) / s.Delay.Seconds()
	record(figure{Name: fmt.Sprintf("slow handler %s: concurrency %d", delay, slowConcurrency), Value: rate, Unit: "events/s",
		CeilingName: fmt.Sprintf("%d calls in flight / %s", slowConcurrency, delay), Ceiling: ideal,
		Target: fmt.Sprintf(">= %.0f ev/s (0.8 of ceiling) with <= 10 PostgreSQL connections in use", 0.8*ideal), Met: met(rate >= 0.8*ideal && conns <= 10),
		Notes: []string{fmt.Sprintf("%d events of %d sources, %d partitions, Concurrency %d per partition; %.1fx today's %.1f ev/s; from the first call to the last commit",
			s.Events, s.Events, benchPartitions, perPartition, rate/today, today),
			fmt.Sprintf("pool of 8: %.2f acquires per event, %s waiting for a connection in all", float64(pw.acquires)/float64(s.Events), pw.wait.Round(time.Millisecond)),
			fmt.Sprintf("records of the calls (HandleBatch in the batch transactions): %d batches, %s in all, %s per partition (the run took %s)",
				pw.batches, pw.handle.Round(time.Millisecond), (pw.handle / benchPartitions).Round(time.Millisecond), time.Duration(float64(s.Events)/rate*float64(time.Second)).Round(time.Millisecond))}})
	rep.measure()(figure{Name: fmt.Sprintf("slow handler %s: PostgreSQL connections in use (peak)", delay), Value: float64(max(conns, 1)), Unit: "connections",
		Target: "<= 10", Met: met(conns <= 10),
		Notes: []string{"the consumer pool's backends not idle, sampled every 10 ms from pg_stat_activity during the concurrent run"}})
	fmt.Printf("slow handler, downstream %s: %.1f ev/s at %d calls in flight (target >= %.0f), peak %d PostgreSQL connections in use; today (concurrency 1) %.1f ev/s; pool: %.2f acquires per event, %s waiting; records: %d batches, %s in all\n",
		delay, rate, slowConcurrency, 0.8*ideal, conns, today, float64(pw.acquires)/float64(s.Events), pw.wait.Round(time.Millisecond), pw.batches, pw.handle.Round(time.Millisecond))
}

// effectingBatch is a batch handler that makes its events' effects before
// the transaction (the http handler).
type effectingBatch interface {
	inbox.BatchHandler
	inbox.Effecter
}

// timedBatch times the batch transactions' HandleBatch calls.
type timedBatch struct {
	effectingBatch
	batches, took atomic.Int64
}

func (t *timedBatch) HandleBatch(ctx context.Context, tx pgx.Tx, evs []inbox.Event) error {
	start := time.Now()
	err := t.effectingBatch.HandleBatch(ctx, tx, evs)
	t.took.Add(int64(time.Since(start)))
	t.batches.Add(1)
	return err
}
