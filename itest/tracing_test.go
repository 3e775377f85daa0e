package itest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestTracingEndToEnd runs the real relay and consumer binaries against the
// real broker, both exporting OTLP/HTTP to a receiver started by the test
// (OTEL_EXPORTER_OTLP_ENDPOINT), and follows one trace from a producer's
// request span through enqueue, the relay's Kafka transaction (a link), the
// consumer's process span and its http handler to the downstream server,
// which sees the same trace id. A redelivered copy of the record shows a
// second process span in that trace, outcome duplicate; an event that
// arrives ahead of its predecessor shows a parked span and, once the gap
// fills, a released span in its own trace.
func TestTracingEndToEnd(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t, 1)
	db := e.db
	if _, err := db.Pool.Exec(context.Background(), effectsTable); err != nil {
		t.Fatal(err)
	}
	recv := testkit.StartOTLPReceiver(t)

	// The downstream API: records the traceparent of each call.
	var mu sync.Mutex
	downstream := map[string][]string{} // idempotency key -> traceparents
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		downstream[r.Header.Get("Idempotency-Key")] = append(downstream[r.Header.Get("Idempotency-Key")], r.Header.Get("traceparent"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	handlers := filepath.Join(t.TempDir(), "handlers.json")
	if err := os.WriteFile(handlers, fmt.Appendf(nil, `{"handlers": [
		{"event_type": "payment.requested", "kind": "http", "http": {"url": %q}},
		{"event_type": "*", "kind": "sql", "sql": %q}]}`, srv.URL+"/charges", effectsSQL), 0o600); err != nil {
		t.Fatal(err)
	}

	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_TRACES_SAMPLER=parentbased_always_on"}
	relay := e.start("relay", append([]string{"OTEL_SERVICE_NAME=it-relay"}, otel...))
	consumer := testkit.Start(t, "consumer", testkit.Binary(t, "consumer"), append([]string{
		"OTEL_SERVICE_NAME=it-consumer",
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + e.topic,
		"ONCEFLOW_TOPICS=" + e.topic,
		"ONCEFLOW_HANDLERS_FILE=" + handlers,
		"ONCEFLOW_HTTP_ADDR=",
	}, otel...), "run")

	// The producer: a request span, and the event enqueued inside it.
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(recv.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, req := tp.Tracer("it-producer").Start(context.Background(), "POST /payments", trace.WithSpanKind(trace.SpanKindServer))
	var res outbox.Result
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) (err error) {
		res, err = outbox.Writer{TracerProvider: tp}.Enqueue(ctx, tx, outbox.Message{Topic: e.topic, Source: "payer-1",
			EventType: "payment.requested", Payload: []byte(`{"amount":5}`)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	req.End()
	traceID := req.SpanContext().TraceID().String()

	inTrace := func(name string) func(testkit.Span) bool {
		return func(s testkit.Span) bool { return s.TraceID == traceID && s.Name == name }
	}
	var enq, proc, hh testkit.Span
	eventually(t, 90*time.Second, "the consumer's process and http handler spans in the request's trace", func() (bool, string) {
		enqs, procs, hhs := recv.Find(inTrace("enqueue "+e.topic)), recv.Find(inTrace("process "+e.topic)), recv.Find(inTrace("handler http"))
		if len(enqs) == 0 || len(procs) == 0 || len(hhs) == 0 {
			return false, fmt.Sprintf("%d enqueue, %d process, %d handler http spans of %d received", len(enqs), len(procs), len(hhs), len(recv.Spans()))
		}
		enq, proc, hh = enqs[0], procs[0], hhs[0]
		return true, ""
	})
	if enq.ParentID != req.SpanContext().SpanID().String() || enq.Kind != "PRODUCER" {
		t.Errorf("enqueue span %s, want a child of the request span", enq)
	}
	if proc.ParentID != enq.SpanID || proc.Service != "it-consumer" || proc.Kind != "CONSUMER" ||
		proc.Attrs["onceflow.outcome"] != "applied" || proc.Attrs["messaging.message.id"] != res.EventID ||
		proc.Attrs["messaging.consumer.group.name"] != "g-"+e.topic || proc.Attrs["messaging.destination.partition.id"] != "0" ||
		proc.Attrs["onceflow.source"] != "payer-1" || proc.Attrs["onceflow.seq"] != "1" || proc.Attrs["messaging.kafka.offset"] == "" {
		t.Errorf("process span %s, want a child of the enqueue span, outcome applied", proc)
	}
	if hh.ParentID != proc.SpanID || hh.Attrs["http.response.status_code"] != "201" || hh.Kind != "CLIENT" {
		t.Errorf("handler http span %s, want a child of the process span, status 201", hh)
	}
	mu.Lock()
	got := downstream["event:"+res.EventID]
	mu.Unlock()
	if want := fmt.Sprintf("00-%s-%s-01", traceID, hh.SpanID); len(got) != 1 || got[0] != want {
		t.Errorf("downstream saw traceparents %v, want [%s]: the request's trace, the handler's span", got, want)
	}

	// The relay's transaction: its own trace, linked to the enqueue span.
	var txn testkit.Span
	eventually(t, 30*time.Second, "the relay transaction span linked to the enqueue span", func() (bool, string) {
		for _, s := range recv.Find(func(s testkit.Span) bool { return s.Name == "relay transaction" }) {
			for _, l := range s.Links {
				if l.TraceID == traceID && l.SpanID == enq.SpanID {
					txn = s
					return true, ""
				}
			}
		}
		return false, fmt.Sprintf("%d spans received", len(recv.Spans()))
	})
	if txn.Service != "it-relay" || txn.TraceID == traceID || txn.Attrs["onceflow.outcome"] != "committed" ||
		txn.Attrs["onceflow.rows"] != "1" || txn.Attrs["onceflow.shard"] != "default" || txn.Links[0].Attrs["messaging.message.id"] != res.EventID {
		t.Errorf("relay transaction span %s", txn)
	}

	// A redelivered copy: a duplicate process span in the same trace, and
	// no second call downstream.
	cl := testkit.Client(t)
	copies := readTopic(t, e.topic, 1)
	dup := copies[0]
	produceRecords(t, cl, &kgo.Record{Topic: dup.Topic, Key: dup.Key, Value: dup.Value, Headers: dup.Headers})
	eventually(t, 60*time.Second, "a duplicate process span in the request's trace", func() (bool, string) {
		for _, s := range recv.Find(inTrace("process " + e.topic)) {
			if s.Attrs["onceflow.outcome"] == "duplicate" && s.ParentID == enq.SpanID {
				return true, ""
			}
		}
		return false, fmt.Sprint(recv.Find(inTrace("process " + e.topic)))
	})

	// Parked then released: seq 2 of a source arrives before seq 1 (a
	// producer writing straight to Kafka), each in a trace of its own.
	second := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0xee, 2}, SpanID: trace.SpanID{0xee, 2}, TraceFlags: trace.FlagsSampled})
	first := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0xee, 1}, SpanID: trace.SpanID{0xee, 1}, TraceFlags: trace.FlagsSampled})
	ev2, ev1 := testEvent("ooo", 2), testEvent("ooo", 1)
	ev2.Traceparent = fmt.Sprintf("00-%s-%s-01", second.TraceID(), second.SpanID())
	ev1.Traceparent = fmt.Sprintf("00-%s-%s-01", first.TraceID(), first.SpanID())
	produce(t, cl, e.topic, ev2)
	eventually(t, 60*time.Second, "seq 2 parked", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE event_id = $1 AND status = 'parked'`, ev2.EventID)
		return n == 1, "not parked yet"
	})
	produce(t, cl, e.topic, ev1)
	secondID := second.TraceID().String()
	eventually(t, 60*time.Second, "seq 2's trace: a parked and a released process span", func() (bool, string) {
		var outcomes []string
		for _, s := range recv.Find(func(s testkit.Span) bool { return s.TraceID == secondID && s.Name == "process "+e.topic }) {
			if s.ParentID != second.SpanID().String() {
				t.Errorf("process span %s, want a child of the producer's span", s)
			}
			outcomes = append(outcomes, s.Attrs["onceflow.outcome"])
		}
		return strings.Contains(fmt.Sprint(outcomes), "parked") && strings.Contains(fmt.Sprint(outcomes), "released"), fmt.Sprint(outcomes)
	})
	checkEffects(t, db, map[string]bool{ev1.EventID: true, ev2.EventID: true})

	// A producer in another language passes its context to the SQL function.
	sqlParent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0x51, 1}, SpanID: trace.SpanID{0x51, 1}, TraceFlags: trace.FlagsSampled})
	if _, err := db.Pool.Exec(context.Background(), `SELECT onceflow.enqueue($1, 'sql-producer', 'note.added', '{}', traceparent => $2, tracestate => 'py=1')`,
		e.topic, fmt.Sprintf("00-%s-%s-01", sqlParent.TraceID(), sqlParent.SpanID())); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the SQL-enqueued event's process span in its producer's trace", func() (bool, string) {
		for _, s := range recv.Find(func(s testkit.Span) bool {
			return s.TraceID == sqlParent.TraceID().String() && s.Name == "process "+e.topic
		}) {
			if s.ParentID == sqlParent.SpanID().String() && s.Attrs["onceflow.outcome"] == "applied" {
				return true, ""
			}
		}
		return false, "not yet"
	})

	// Graceful exit flushes the spans.
	for _, p := range []*testkit.Proc{consumer, relay} {
		p.Signal(syscall.SIGTERM)
		if err := p.Wait(60 * time.Second); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		if !strings.Contains(p.Output(), "tracing: spans flushed") {
			t.Errorf("%s did not flush its spans on exit", p.Name)
		}
	}
	t.Logf("trace %s: %d spans received in all", traceID, len(recv.Spans()))
}

// readTopic reads n records of topic (read_committed) from the start.
func readTopic(t *testing.T, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := testkit.Client(t, kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: %d of %d records", topic, len(out), n)
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}
