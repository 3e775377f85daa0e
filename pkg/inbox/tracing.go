package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// Tracing (see docs/tracing.md). Everything OpenTelemetry touches in this
// package is here; the engine calls these helpers at a few points:
//
//   - per record, a "process <topic>" span continuing the event's own trace
//     (its traceparent), ended with the event's outcome once the batch
//     committed;
//   - per Postgres transaction, an "inbox transaction" span (a new trace),
//     linked from the process spans of the events it committed;
//   - a released parked event gets a second process span, outcome released;
//   - the built-in handlers' "handler sql" and "handler http" spans, children
//     of the event's process span; the http handler sends traceparent;
//   - a given-up gap records the trace ids of the events it involved.

// TracerName is the instrumentation scope of this package's spans.
const TracerName = "github.com/onceflow/onceflow/pkg/inbox"

// Event outcomes, the onceflow.outcome attribute of a process span.
const (
	outcomeApplied      = "applied"
	outcomeDuplicate    = "duplicate"
	outcomeParked       = "parked"
	outcomeReleased     = "released"
	outcomeLate         = "late"
	outcomeHeld         = "held"
	outcomeDeadLettered = "dead_lettered"
	// outcomeNotCommitted: the worker was stopped (revocation, shutdown)
	// before the event's transaction committed; the partition's next owner
	// reads it again.
	outcomeNotCommitted = "not_committed"
)

// onceflow's own span attribute keys (the others are OpenTelemetry
// semantic conventions).
const (
	attrSource = attribute.Key("onceflow.source")
	// The stream of a given-up gap: its producer and topic ("" for a
	// legacy stream).
	attrProducer    = attribute.Key("onceflow.producer")
	attrStreamTopic = attribute.Key("onceflow.stream_topic")
	attrSeq         = attribute.Key("onceflow.seq")
	attrEventType   = attribute.Key("onceflow.event_type")
	attrOutcome     = attribute.Key("onceflow.outcome")
	attrConsumer    = attribute.Key("onceflow.consumer")
	attrLate        = attribute.Key("onceflow.late")
	attrAttempt     = attribute.Key("onceflow.attempt")
	attrTraceIDs    = attribute.Key("onceflow.trace_ids")
	attrGap         = attribute.Key("onceflow.gap")
	attrReason      = attribute.Key("onceflow.reason")
)

// maxGapTraceIDs bounds the trace ids a given-up gap records.
const maxGapTraceIDs = 10

// w3c is the envelope's propagation format, whatever the process's global
// propagator is.
var w3c = propagation.TraceContext{}

// tracing holds the consumer's tracer (nil acts as off). off is set for a no-op provider: then
// no span is started at all (the event's remote context is still extracted
// where a log line or an outbound call needs it).
type tracing struct {
	tr       trace.Tracer
	off      bool
	group    string
	consumer string
}

func newTracing(cfg *Config) *tracing {
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	_, off := tp.(noop.TracerProvider)
	return &tracing{tr: tp.Tracer(TracerName), off: off, group: cfg.Group, consumer: cfg.ConsumerName}
}

// eventCarrier reads an event's trace context: its traceparent and the
// tracestate header.
type eventCarrier struct{ ev *Event }

func (c eventCarrier) Get(key string) string {
	switch key {
	case envelope.HeaderTraceparent:
		return c.ev.Traceparent
	case envelope.HeaderTracestate:
		return c.ev.Headers[envelope.HeaderTracestate]
	}
	return ""
}
func (c eventCarrier) Set(string, string) {}
func (c eventCarrier) Keys() []string {
	return []string{envelope.HeaderTraceparent, envelope.HeaderTracestate}
}

// remote returns ctx carrying ev's producer context, if it has one.
func remote(ctx context.Context, ev *Event) context.Context {
	if ev.Traceparent == "" {
		return ctx
	}
	return w3c.Extract(ctx, eventCarrier{ev})
}

// recordRemote is remote for a malformed record: its raw traceparent, if any.
func recordRemote(ctx context.Context, it *item) context.Context {
	var c propagation.MapCarrier
	for _, h := range it.rec.Headers {
		if k := strings.ToLower(h.Key); k == envelope.HeaderTraceparent || k == envelope.HeaderTracestate {
			if c == nil {
				c = propagation.MapCarrier{}
			}
			c[k] = string(h.Value)
		}
	}
	if c == nil {
		return ctx
	}
	return w3c.Extract(ctx, c)
}

// EventContext returns ctx carrying ev's process span (or, with tracing off,
// the producer's trace context the event brought along), so that what a
// BatchHandler does for one event (its own spans, log lines, outbound calls
// with traceparent) joins that event's trace. A Handler's ctx already is
// its event's.
func EventContext(ctx context.Context, ev Event) context.Context {
	if ev.span != nil {
		return trace.ContextWithSpan(ctx, ev.span)
	}
	return remote(ctx, &ev)
}

// itemContext is EventContext for an item, malformed or not.
func itemContext(ctx context.Context, it *item) context.Context {
	if it.span != nil {
		return trace.ContextWithSpan(ctx, it.span)
	}
	if it.bad != nil {
		return recordRemote(ctx, it)
	}
	return remote(ctx, &it.ev)
}

// startProcess starts the process span of every item, continuing the
// event's trace.
func (t *tracing) startProcess(ctx context.Context, items []item) {
	if t == nil || t.off {
		return
	}
	for i := range items {
		it := &items[i]
		pctx := itemContext(ctx, it)
		_, span := t.tr.Start(pctx, "process "+it.rec.Topic, trace.WithSpanKind(trace.SpanKindConsumer))
		if span.IsRecording() {
			span.SetAttributes(t.recordAttrs(it.rec.Topic, it.rec.Partition, it.rec.Offset)...)
			if it.bad == nil {
				span.SetAttributes(t.eventAttrs(&it.ev)...)
			} else {
				span.SetAttributes(semconv.MessagingMessageID(it.key))
			}
		}
		it.span = span
		it.ev.span = span
	}
}

func (t *tracing) recordAttrs(topic string, partition int32, offset int64) []attribute.KeyValue {
	return []attribute.KeyValue{
		semconv.MessagingSystemKafka, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(topic), semconv.MessagingDestinationPartitionID(strconv.Itoa(int(partition))),
		semconv.MessagingKafkaOffset(int(offset)), semconv.MessagingConsumerGroupName(t.group), attrConsumer.String(t.consumer),
	}
}

func (t *tracing) eventAttrs(ev *Event) []attribute.KeyValue {
	return []attribute.KeyValue{
		semconv.MessagingMessageID(ev.EventID), attrSource.String(ev.Source), attrSeq.Int64(ev.Seq), attrEventType.String(ev.EventType),
	}
}

// endProcess ends the items' process spans with their outcomes; err non-nil
// means the worker stopped before the last transaction committed.
func (t *tracing) endProcess(items []item, err error) {
	for i := range items {
		it := &items[i]
		if it.span == nil {
			continue
		}
		if it.span.IsRecording() {
			res := it.result
			if err != nil || res == "" {
				res = outcomeNotCommitted
				it.span.AddEvent("not committed: the worker stopped; the partition's next owner reads the record again")
			}
			it.span.SetAttributes(attrOutcome.String(res))
			if it.bad != nil {
				it.span.SetStatus(codes.Error, it.bad.Error())
			} else if res == outcomeDeadLettered {
				it.span.SetStatus(codes.Error, "dead-lettered")
			}
		}
		it.span.End()
	}
}

// handlerFailed notes a failed try of one event on its process span.
func handlerFailed(it *item, attempt int, err error) {
	if it.span != nil && it.span.IsRecording() {
		it.span.AddEvent("handler failed", trace.WithAttributes(attrAttempt.Int(attempt),
			attribute.String("exception.message", err.Error())))
	}
}

// noteAdmitted sets the outcome of the item the guard just decided on, and
// adds the guard's decisions to its span.
func (t *tracing) noteAdmitted(it *item, v admitted) {
	steps := v.raw
	it.result = outcomeParked
	for _, e := range v.apply {
		if e.EventID == it.ev.EventID {
			it.result = outcomeApplied
			if e.Late {
				it.result = outcomeLate
			}
		}
	}
	for _, st := range steps {
		switch st.Kind {
		case seqguard.StepHold, seqguard.StepSeqConflict:
			it.result = outcomeHeld
		case seqguard.StepDuplicate:
			// Applied in order before; its inbox row was pruned.
			it.result = outcomeDuplicate
		}
	}
	if it.span == nil || !it.span.IsRecording() {
		return
	}
	for _, st := range steps {
		switch st.Kind {
		case seqguard.StepGapOpened, seqguard.StepGapFilled, seqguard.StepGapGivenUp, seqguard.StepSeqConflict, seqguard.StepHold:
			attrs := []attribute.KeyValue{attrGap.String(st.Gap.String())}
			if st.Kind == seqguard.StepGapOpened {
				attrs = append(attrs, attribute.String("onceflow.deadline", st.Gap.Deadline.UTC().Format("2006-01-02T15:04:05.000Z")))
			}
			if st.Reason != "" {
				attrs = append(attrs, attrReason.String(string(st.Reason)))
			}
			if st.Kind == seqguard.StepHold || st.Kind == seqguard.StepSeqConflict {
				attrs = []attribute.KeyValue{attrSeq.Int64(st.Seq)}
			}
			it.span.AddEvent("sequence guard: "+st.Kind.String(), trace.WithAttributes(attrs...))
		}
	}
}

// releaseReason says why the guard released parked events in steps.
func releaseReason(steps []seqguard.Step) string {
	for _, st := range steps {
		switch st.Kind {
		case seqguard.StepGapGivenUp:
			return fmt.Sprintf("gap %s given up (%s)", st.Gap, st.Reason)
		case seqguard.StepGapFilled:
			return fmt.Sprintf("gap %s filled", st.Gap)
		}
	}
	return "its turn came"
}

// releasedSpan is the process span of a released parked event.
type releasedSpan struct {
	id   string
	span trace.Span
}

// startReleased starts a process span, outcome released, for each event in
// evs that has none: parked events the guard releases now. Each continues
// its own event's trace, so that a parked event's trace shows the parked
// delivery and, later, its release. The caller ends them with endReleased.
func (t *tracing) startReleased(ctx context.Context, evs []Event, why string) []releasedSpan {
	if t == nil || t.off {
		return nil
	}
	var spans []releasedSpan
	for i := range evs {
		ev := &evs[i]
		if ev.span != nil {
			continue
		}
		_, span := t.tr.Start(remote(ctx, ev), "process "+ev.Topic, trace.WithSpanKind(trace.SpanKindConsumer))
		if span.IsRecording() {
			span.SetAttributes(t.recordAttrs(ev.Topic, ev.Partition, ev.Offset)...)
			span.SetAttributes(t.eventAttrs(ev)...)
			span.SetAttributes(attrLate.Bool(ev.Late))
			span.AddEvent("released from parking: " + why)
		}
		ev.span = span
		spans = append(spans, releasedSpan{id: ev.EventID, span: span})
	}
	return spans
}

// endReleased ends the released events' spans: outcome released once the
// transaction committed (dead_lettered for one whose handler kept failing),
// an error status when it rolled back (the events stay parked and are
// released again).
func endReleased(spans []releasedSpan, txSpan trace.Span, out *outcome, err error) {
	for _, r := range spans {
		s := r.span
		if s.IsRecording() {
			switch {
			case err != nil:
				s.SetStatus(codes.Error, "rolled back, still parked: "+err.Error())
			case out.isDeadReleased(r.id):
				s.SetAttributes(attrOutcome.String(outcomeDeadLettered))
				s.SetStatus(codes.Error, "dead-lettered")
			default:
				s.SetAttributes(attrOutcome.String(outcomeReleased))
			}
			if err == nil {
				s.AddLink(trace.Link{SpanContext: txSpan.SpanContext()})
			}
		}
		s.End()
	}
}

// startTx starts the span of one inbox transaction (a new trace), begun at
// opts' timestamp if given.
func (t *tracing) startTx(ctx context.Context, name string, items []item, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t == nil || t.off {
		return ctx, trace.SpanFromContext(context.Background())
	}
	ctx, span := t.tr.Start(ctx, name, append(opts, trace.WithNewRoot())...)
	if span.IsRecording() {
		span.SetAttributes(semconv.DBSystemNamePostgreSQL, semconv.MessagingSystemKafka,
			semconv.MessagingConsumerGroupName(t.group), attrConsumer.String(t.consumer))
		if len(items) > 0 {
			r := items[0].rec
			span.SetAttributes(semconv.MessagingDestinationName(r.Topic),
				semconv.MessagingDestinationPartitionID(strconv.Itoa(int(r.Partition))),
				semconv.MessagingBatchMessageCount(len(items)))
		}
	}
	return ctx, span
}

// endTx ends a transaction span with what it did; when it committed, the
// items' process spans link to it.
func endTx(span trace.Span, items []item, out *outcome, err error) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, "rolled back: "+err.Error())
		span.RecordError(err)
		return
	}
	c := out.guard.counts
	span.SetAttributes(
		attribute.Int("onceflow.applied", out.processed), attribute.Int("onceflow.duplicates", out.duplicates),
		attribute.Int("onceflow.parked", c.Parked), attribute.Int("onceflow.held", c.Held), attribute.Int("onceflow.late", c.Late),
		attribute.Int("onceflow.dead_lettered", out.dead), attribute.Int("onceflow.gaps_given_up", c.GapsGivenUp))
	for i := range out.guard.givenUp {
		g := &out.guard.givenUp[i]
		g.txSpan = span.SpanContext()
		span.AddEvent("sequence gap given up", trace.WithAttributes(attrSource.String(g.stream.Source), attrProducer.String(g.stream.Producer), attrStreamTopic.String(g.stream.Topic),
			attrGap.String(g.step.Gap.String()), attrReason.String(string(g.step.Reason)), attrTraceIDs.StringSlice(g.traceIDs)))
	}
	link := trace.Link{SpanContext: span.SpanContext()}
	for i := range items {
		if s := items[i].span; s != nil && s.IsRecording() {
			s.AddLink(link)
		}
	}
}

// outcomeTraceIDs are the trace ids of the events an outcome applies
// (distinct, at most maxGapTraceIDs): for a given-up gap, the events that
// waited behind it.
func outcomeTraceIDs(o seqguard.Outcome) []string {
	var ids []string
	seen := map[string]bool{}
	for _, a := range o.Apply {
		if len(ids) == maxGapTraceIDs {
			break
		}
		var hs map[string]string
		if len(a.Event.Headers) == 0 || json.Unmarshal(a.Event.Headers, &hs) != nil {
			continue
		}
		ev := Event{Envelope: envelope.Envelope{Traceparent: hs[envelope.HeaderTraceparent]}}
		if ev.Traceparent == "" {
			continue
		}
		if sc := trace.SpanContextFromContext(remote(context.Background(), &ev)); sc.IsValid() && !seen[sc.TraceID().String()] {
			seen[sc.TraceID().String()] = true
			ids = append(ids, sc.TraceID().String())
		}
	}
	return ids
}

// recordGapTraces stores the trace ids of given-up gaps in their rows.
func (a *applier) recordGapTraces(ctx context.Context, tx pgx.Tx, gaps []givenUpGap) error {
	for _, g := range gaps {
		if len(g.traceIDs) == 0 {
			continue
		}
		if _, err := tx.Exec(ctx, qGapTraceIDs, a.cfg.ConsumerName, g.stream.Source, g.step.Gap.From, g.step.Gap.To, g.traceIDs,
			g.stream.Producer, g.stream.Topic); err != nil {
			return fmt.Errorf("record given-up gap's trace ids: %w", err)
		}
	}
	return nil
}
