package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// recordingProvider returns a tracer provider that samples every span and
// keeps the ended ones in memory.
func recordingProvider() (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	sr := tracetest.NewSpanRecorder()
	return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(sdktrace.AlwaysSample())), sr
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func spansNamed(sr *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func storedTrace(t *testing.T, b bundle, eventID string) (traceparent, tracestate string) {
	t.Helper()
	var tp, ts *string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT headers->>'traceparent', headers->>'tracestate' FROM onceflow.outbox WHERE event_id = $1`,
		eventID).Scan(&tp, &ts); err != nil {
		t.Fatal(err)
	}
	if tp != nil {
		traceparent = *tp
	}
	if ts != nil {
		tracestate = *ts
	}
	return traceparent, tracestate
}

// Enqueue makes one "enqueue <topic>" span, a child of the caller's span,
// with the messaging attributes, and the event carries that span's context
// (traceparent and the caller's tracestate) to the relay and the consumer.
func TestEnqueueSpanAndTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, sr := recordingProvider()
	w := outbox.Writer{TracerProvider: tp}
	ts, err := trace.ParseTraceState("vendor=abc,other=1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, req := tp.Tracer("test").Start(b.ctx, "request")
	ctx = trace.ContextWithSpanContext(ctx, req.SpanContext().WithTraceState(ts))
	var res outbox.Result
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		res, err = w.Enqueue(ctx, tx, msg("order-1"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	req.End()

	spans := spansNamed(sr, "enqueue orders")
	if len(spans) != 1 {
		t.Fatalf("%d enqueue spans, want 1 (ended: %v)", len(spans), sr.Ended())
	}
	s := spans[0]
	if s.Parent().SpanID() != req.SpanContext().SpanID() || s.SpanContext().TraceID() != req.SpanContext().TraceID() {
		t.Errorf("enqueue span's parent %v, want the request span %v", s.Parent(), req.SpanContext())
	}
	if s.SpanKind() != trace.SpanKindProducer {
		t.Errorf("span kind %v, want producer", s.SpanKind())
	}
	a := attrs(s)
	for k, want := range map[attribute.Key]string{
		"messaging.system": "kafka", "messaging.operation.type": "create", "messaging.operation.name": "enqueue",
		"messaging.destination.name": "orders", "messaging.message.id": res.EventID, "onceflow.source": "order-1",
		"onceflow.event_type": "order.created",
	} {
		if got := a[k].AsString(); got != want {
			t.Errorf("attribute %s = %q, want %q", k, got, want)
		}
	}
	if got := a["onceflow.seq"].AsInt64(); got != res.Seq {
		t.Errorf("onceflow.seq = %d, want %d", got, res.Seq)
	}
	gotTP, gotTS := storedTrace(t, b, res.EventID)
	wantTP := fmt.Sprintf("00-%s-%s-01", s.SpanContext().TraceID(), s.SpanContext().SpanID())
	if gotTP != wantTP || gotTS != "vendor=abc,other=1" {
		t.Errorf("stored traceparent %q tracestate %q, want %q and the caller's tracestate", gotTP, gotTS, wantTP)
	}
}

// A traceparent set by the caller wins over ctx; EnqueueBatch makes one span
// for the call and every message without its own carries its context.
func TestEnqueueBatchSpanAndCallerTraceparent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, sr := recordingProvider()
	w := outbox.Writer{TracerProvider: tp}
	own := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ctx, req := tp.Tracer("test").Start(b.ctx, "request")
	msgs := []outbox.Message{msg("b"), msg("a"), msg("c")}
	msgs[2].Traceparent = own
	var res []outbox.Result
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) (err error) {
		res, err = w.EnqueueBatch(ctx, tx, msgs)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	req.End()
	if msgs[0].Traceparent != "" {
		t.Errorf("EnqueueBatch changed the caller's messages: %q", msgs[0].Traceparent)
	}
	spans := spansNamed(sr, "enqueue orders")
	if len(spans) != 1 {
		t.Fatalf("%d enqueue spans, want 1", len(spans))
	}
	if n := attrs(spans[0])["messaging.batch.message_count"].AsInt64(); n != 3 {
		t.Errorf("messaging.batch.message_count = %d, want 3", n)
	}
	sc := spans[0].SpanContext()
	want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
	for i, r := range res {
		got, _ := storedTrace(t, b, r.EventID)
		if i == 2 {
			want = own
		}
		if got != want {
			t.Errorf("message %d: stored traceparent %q, want %q", i, got, want)
		}
	}
}

// With tracing off (a no-op provider) no span is made, but the caller's
// trace context still travels with the event; without one, none is stored.
func TestEnqueueTracingOffKeepsCallerContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := outbox.Writer{TracerProvider: noop.NewTracerProvider()}
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	res, err := b.enqueue(t, w, msg("x")) // no trace in ctx
	if err != nil {
		t.Fatal(err)
	}
	if tp, _ := storedTrace(t, b, res.EventID); tp != "" {
		t.Errorf("stored traceparent %q without a trace in ctx, want none", tp)
	}
	ctx := trace.ContextWithRemoteSpanContext(b.ctx, parent)
	if err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		res, err = w.Enqueue(ctx, tx, msg("y"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("00-%s-%s-01", parent.TraceID(), parent.SpanID())
	if tp, _ := storedTrace(t, b, res.EventID); tp != want {
		t.Errorf("stored traceparent %q, want the caller's %q", tp, want)
	}
}

// A tracestate must be W3C-shaped and come with a traceparent; a refused
// message ends its span with an error.
func TestEnqueueRefusesBadTracestate(t *testing.T) {
	t.Parallel()
	tp, sr := recordingProvider()
	w := outbox.Writer{TracerProvider: tp}
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, tt := range []struct {
		name   string
		mutate func(*outbox.Message)
	}{
		{"not W3C", func(m *outbox.Message) { m.Traceparent, m.Tracestate = parent, "Upper=1" }},
		{"too long", func(m *outbox.Message) {
			m.Traceparent, m.Tracestate = parent, "k="+strings.Repeat("v", 600)
		}},
		{"duplicate key", func(m *outbox.Message) { m.Traceparent, m.Tracestate = parent, "a=1,a=2" }},
		{"without traceparent", func(m *outbox.Message) { m.Tracestate = "a=1" }},
		{"header without traceparent", func(m *outbox.Message) { m.Headers = map[string]string{"tracestate": "a=1"} }},
		{"both", func(m *outbox.Message) {
			m.Traceparent, m.Tracestate, m.Headers = parent, "a=1", map[string]string{"tracestate": "b=2"}
		}},
	} {
		m := msg("s")
		tt.mutate(&m)
		_, err := w.Enqueue(context.Background(), nil, m)
		var fe *outbox.FieldError
		if !errors.As(err, &fe) || fe.Field != envelope.HeaderTracestate {
			t.Errorf("%s: Enqueue = %v, want a tracestate FieldError", tt.name, err)
		}
	}
	for _, s := range sr.Ended() {
		if s.Status().Code != codes.Error {
			t.Errorf("span %s of a refused message has status %v, want Error", s.Name(), s.Status())
		}
	}
	if n := len(sr.Ended()); n != 6 {
		t.Errorf("%d spans, want 6", n)
	}
}
