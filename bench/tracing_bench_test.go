package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// BenchmarkTracingOverhead measures what tracing costs on the two hot paths
// it instruments, in the same run:
//
//   - Enqueue, one event per transaction, 8 producers, each inside a request
//     span of its own (the caller's trace);
//   - the consumer's apply path: the drain of a pre-filled topic whose
//     records carry a traceparent, with the sql upsert handler;
//
// each with tracing off (a no-op provider: what both binaries use when no
// OTEL_* variable is set), with the global default provider (a library user
// who configured nothing), and on, batched and exported over OTLP/HTTP to a
// local receiver that discards the requests: with one trace in ten sampled
// (by the producer: the records carry the sampled flag on one in ten), and
// with every span sampled. The modes alternate over two rounds and the best
// of each counts, to damp the noise of a shared machine; CPU per event is
// this process's (the producer's or the consumer's side, PostgreSQL
// excluded).
func BenchmarkTracingOverhead(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	tracingOverhead(b, benchReport, sz)
}

const (
	tracingOff    = "tracing off"
	tracingGlobal = "tracing default (global provider, no SDK)"
	tracingTenth  = "tracing on, 1 trace in 10 sampled"
	tracingOn     = "tracing on, every span exported"
)

var tracingModes = []string{tracingOff, tracingGlobal, tracingTenth, tracingOn}

func tracingOverhead(tb testing.TB, rep *report, sz sizes) {
	on, stopOn := exportingProvider(tb, sdktrace.AlwaysSample())
	defer stopOn()
	// Enqueue: the request span (a root) is sampled one time in ten; the
	// consumer: the records' sampled flag decides.
	tenthEnqueue, stopTenthEnqueue := exportingProvider(tb, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.1)))
	defer stopTenthEnqueue()
	tenthConsume, stopTenthConsume := exportingProvider(tb, sdktrace.ParentBased(sdktrace.AlwaysSample()))
	defer stopTenthConsume()
	providers := map[string]trace.TracerProvider{tracingOff: noop.NewTracerProvider(), tracingGlobal: otel.GetTracerProvider(), tracingOn: on,
		tracingTenth: tenthEnqueue}

	// Enqueue.
	db := testkit.NewDB(tb)
	record := rep.measure()
	rate, cpu := map[string]float64{}, map[string]float64{}
	for round := range 2 {
		for _, mode := range tracingModes {
			r, c := enqueueTraced(tb, db, providers[mode], fmt.Sprintf("%d-%s", round, mode), sz.EnqueueFor)
			if r > rate[mode] {
				rate[mode], cpu[mode] = r, c
			}
		}
	}
	recordOverhead(record, "enqueue", "enqueue, 1 event/txn, 8 producers", rate, cpu)

	// The consumer's apply path.
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.bench_state (source text PRIMARY KEY, seq bigint NOT NULL, n bigint NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	topic := testkit.Topic(tb, "bench-tracing", benchPartitions, nil)
	prefillTraced(tb, topic, sz.TracingEvents)
	h := sqlUpsertHandler(tb)
	providers[tracingTenth] = tenthConsume
	record = rep.measure()
	rate, cpu = map[string]float64{}, map[string]float64{}
	for round := range 2 {
		for mi, mode := range tracingModes {
			for _, q := range []string{`TRUNCATE onceflow.inbox, onceflow.consumer_offsets, onceflow.seq_state, onceflow.seq_applied, onceflow.seq_gaps, public.bench_state`, `VACUUM ANALYZE onceflow.inbox`} {
				if _, err := db.Pool.Exec(ctx, q); err != nil {
					tb.Fatal(err)
				}
			}
			c0 := cpuOf(os.Getpid())
			d, _ := drain(tb, db.Pool, topic, fmt.Sprintf("tracing-%d-%d", round, mi), h, "onceflow_consumer_processed_total", sz.TracingEvents,
				func(c *inbox.Config) { c.TracerProvider = providers[mode] })
			r := float64(sz.TracingEvents) / d.Seconds()
			if r > rate[mode] {
				rate[mode], cpu[mode] = r, (cpuOf(os.Getpid())-c0)/float64(sz.TracingEvents)
			}
		}
	}
	recordOverhead(record, "consumer", "consumer drain (sql handler)", rate, cpu)
}

// recordOverhead records each mode's rate against tracing off as the
// ceiling, and the CPU per event of off and on.
func recordOverhead(record func(figure), name, what string, rate, cpu map[string]float64) {
	for _, mode := range tracingModes {
		f := figure{Name: mode + ": " + what, Value: rate[mode], Unit: "events/s"}
		if mode != tracingOff {
			f.CeilingName, f.Ceiling = tracingOff, rate[tracingOff]
			f.Notes = []string{fmt.Sprintf("%.1f%% of %s's rate; best of 2 alternating rounds", 100*rate[mode]/rate[tracingOff], tracingOff)}
		}
		record(f)
	}
	for _, mode := range tracingModes {
		f := figure{Name: mode + ": " + name + " CPU per event", Value: cpu[mode] * 1e6, Unit: "µs (this process)"}
		if mode != tracingOff {
			f.CeilingName, f.Ceiling = tracingOff, cpu[tracingOff]*1e6
			f.Notes = []string{"ratio > 1: more CPU than with tracing off"}
		}
		record(f)
	}
	fmt.Printf("tracing overhead, %s:\n", what)
	for _, mode := range tracingModes {
		fmt.Printf("  %-45s %7.0f ev/s (%5.1f%%)  %6.1f µs CPU/event\n", mode, rate[mode], 100*rate[mode]/rate[tracingOff], cpu[mode]*1e6)
	}
}

// exportingProvider samples every span and exports them over OTLP/HTTP to a
// local receiver that reads and discards each request, as a collector would
// take them. The queue is large enough that no span is dropped.
func exportingProvider(tb testing.TB, sampler sdktrace.Sampler) (*sdktrace.TracerProvider, func()) {
	tb.Helper()
	var spansBytes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		spansBytes.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
	if err != nil {
		tb.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler),
		sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(1<<17), sdktrace.WithMaxExportBatchSize(2048)))
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			tb.Errorf("flush spans: %v", err)
		}
		srv.Close()
		if spansBytes.Load() == 0 {
			tb.Errorf("tracing on exported nothing")
		}
	}
}

// enqueueTraced runs 8 producers for d, each event in its own transaction
// inside a request span, and returns events/s and CPU seconds per event.
func enqueueTraced(tb testing.TB, db *testkit.DB, tp trace.TracerProvider, tag string, d time.Duration) (float64, float64) {
	ctx := context.Background()
	w := outbox.Writer{TracerProvider: tp}
	tr := tp.Tracer("bench-producer")
	var n atomic.Int64
	var wg sync.WaitGroup
	c0 := cpuOf(os.Getpid())
	deadline := time.Now().Add(d)
	for p := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				rctx, req := tr.Start(ctx, "request")
				err := pgx.BeginFunc(rctx, db.Pool, func(tx pgx.Tx) error {
					_, err := w.Enqueue(rctx, tx, outbox.Message{Topic: "t", Source: fmt.Sprintf("%s-%d-%d", tag, p, i%16), EventType: "x", Payload: []byte(`{}`)})
					return err
				})
				req.End()
				if err != nil {
					tb.Error(err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	events := float64(n.Load())
	return events / d.Seconds(), (cpuOf(os.Getpid()) - c0) / events
}

// prefillTraced produces n events whose records carry a traceparent (one in
// ten with the sampled flag), spread over benchSources sources.
func prefillTraced(tb testing.TB, topic string, n int) {
	tb.Helper()
	cl := testkit.Client(tb, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond),
		kgo.MaxBufferedRecords(100_000), kgo.ProducerBatchMaxBytes(1<<20))
	payload := []byte(`{"pad":"` + strings.Repeat("x", benchPayload-len(`{"pad":""}`)) + `"}`)
	seqs := make([]int64, benchSources)
	recs := make([]*kgo.Record, 0, n)
	for i := range n {
		src := i % benchSources
		seqs[src]++
		flags := "00"
		if i%10 == 0 {
			flags = "01"
		}
		ev := envelope.Envelope{EventID: fmt.Sprintf("traced-%d", i), Source: fmt.Sprintf("src-%d", src), Seq: seqs[src],
			EventType: "bench.event", Payload: payload,
			Traceparent: fmt.Sprintf("00-%032x-%016x-%s", i+1, i+1, flags)}
		recs = append(recs, ev.Record(topic))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		tb.Fatalf("prefill: %v", err)
	}
}
