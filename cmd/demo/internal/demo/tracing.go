package demo

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/obs"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// Tracing in the demo: when OTEL_EXPORTER_OTLP_ENDPOINT (or another OTEL_*
// setting that turns the exporter on) is set, the producer runs each write
// in an "agent request" span and the children inherit the environment, so
// that the relay and the consumer export their spans to the same place. The
// summary then names one trace per chaos case to open in the tracing UI.

// ExampleTrace is a trace that shows one chaos case.
type ExampleTrace struct {
	Case    string
	TraceID string
	EventID string
	// Look says what the trace shows.
	Look string
}

type demoTracing struct {
	t  *obs.Tracing
	tr trace.Tracer

	mu        sync.Mutex
	traces    map[string]string // event id -> trace id
	lastID    string            // the last event written through the outbox
	killed    map[string]string // victim -> the event written just before its first kill
	rolled    string            // a rolled-back event
	sqlWriter string            // an event written through the SQL function
}

// newDemoTracing is nil unless the environment turns tracing on.
func newDemoTracing(ctx context.Context) (*demoTracing, error) {
	t, err := obs.NewTracing(ctx, "onceflow-demo-producer", slog.New(slog.DiscardHandler), os.Getenv)
	if err != nil || !t.Enabled {
		return nil, err
	}
	return &demoTracing{t: t, tr: t.Provider.Tracer("github.com/onceflow/onceflow/cmd/demo/internal/demo"),
		traces: map[string]string{}, killed: map[string]string{}}, nil
}

func (d *demoTracing) provider() trace.TracerProvider {
	if d == nil {
		return nil
	}
	return d.t.Provider
}

// request starts the span of one producer request.
func (d *demoTracing) request(ctx context.Context, name string, attrs ...string) (context.Context, func()) {
	if d == nil {
		return ctx, func() {}
	}
	ctx, span := d.tr.Start(ctx, name, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindServer))
	for i := 0; i+1 < len(attrs); i += 2 {
		span.SetAttributes(attribute.String(attrs[i], attrs[i+1]))
	}
	return ctx, func() { span.End() }
}

// traceparent is ctx's span context as a W3C traceparent ("" when none).
func (d *demoTracing) traceparent(ctx context.Context) string {
	if d == nil {
		return ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c[envelope.HeaderTraceparent]
}

// How an event was written, for written.
const (
	viaOutbox  = "outbox"
	viaSQLFunc = "sql"
	rolledBack = "rolled back"
	viaForeign = "foreign"
)

// written records the trace of an event the demo wrote (how: one of the
// constants above).
func (d *demoTracing) written(ctx context.Context, eventID, how string) {
	if d == nil {
		return
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.traces[eventID] = sc.TraceID().String()
	switch how {
	case rolledBack:
		if d.rolled == "" {
			d.rolled = eventID
		}
	case viaSQLFunc:
		d.lastID = eventID
		if d.sqlWriter == "" {
			d.sqlWriter = eventID
		}
	case viaOutbox:
		d.lastID = eventID
	}
}

// kill remembers the event written just before victim's first SIGKILL.
func (d *demoTracing) kill(victim string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.killed[victim]; !ok && d.lastID != "" {
		d.killed[victim] = d.lastID
	}
}

// examples picks one trace per chaos case.
func (r *run) exampleTraces(ctx context.Context) []ExampleTrace {
	d := r.tracing
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []ExampleTrace
	add := func(c, id, look string) {
		if tid := d.traces[id]; tid != "" {
			out = append(out, ExampleTrace{Case: c, TraceID: tid, EventID: id, Look: look})
		}
	}
	var dup string
	r.dupIDs.Range(func(k, _ any) bool {
		if d.traces[k.(string)] != "" {
			dup = k.(string)
			return false
		}
		return true
	})
	add("duplicate delivery", dup, "two process spans: applied, then duplicate (no second side effect)")
	add("out of order", oooSource+":4", "a process span parked (gap 3-3 opened), then one released (gap filled)")
	add("gap never filled", gapSource+":4", "parked, then released by the gap timer (gap 3-3 given up); the gap row lists this trace id")
	for _, victim := range []string{"relay-a", "consumer-a", "relay-b", "consumer-b"} {
		add(victim+" SIGKILLed", d.killed[victim], "written just before the kill: published and applied once across the restart")
	}
	add("rolled back", d.rolled, "request and enqueue spans only: never published")
	add("written through SQL", d.sqlWriter, "onceflow.enqueue(…, traceparent => …): the relay's link and the consumer's spans join the request's trace")
	var ids []string
	if err := r.pool.QueryRow(ctx, `SELECT coalesce(trace_ids, '{}') FROM onceflow.seq_gaps WHERE source = $1 AND state = 'given_up' ORDER BY id LIMIT 1`,
		gapSource).Scan(&ids); err == nil && len(ids) > 0 {
		out = append(out, ExampleTrace{Case: "given-up gap's row", TraceID: ids[0], Look: fmt.Sprintf("onceflow.seq_gaps.trace_ids of %s: %v", gapSource, ids)})
	}
	return out
}

// flush exports what is left (the children flush their own on SIGTERM).
func (d *demoTracing) flush(ctx context.Context) {
	if d == nil {
		return
	}
	d.t.ShutdownLogged(ctx, slog.New(slog.DiscardHandler))
}
