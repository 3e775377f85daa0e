package outbox

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/envelope"
)

// Tracing (see docs/tracing.md). Everything OpenTelemetry touches in this
// package is in this file: the "enqueue" span and the trace context a
// message takes from ctx, and the relay's "relay transaction" span with a
// link to each event's producer context.

// TracerName is the instrumentation scope of this package's spans.
const TracerName = "github.com/onceflow/onceflow/pkg/outbox"

// Span attribute keys of onceflow's own (the rest are OpenTelemetry
// semantic conventions).
const (
	attrSource    = attribute.Key("onceflow.source")
	attrSeq       = attribute.Key("onceflow.seq")
	attrEventType = attribute.Key("onceflow.event_type")
	attrShard     = attribute.Key("onceflow.shard")
	attrRows      = attribute.Key("onceflow.rows")
	attrBytes     = attribute.Key("onceflow.bytes")
	attrOutcome   = attribute.Key("onceflow.outcome")
	attrCkptIDs   = attribute.Key("onceflow.checkpoint_ids")
	attrMarked    = attribute.Key("onceflow.marked")
	attrTxnID     = attribute.Key("onceflow.transactional_id")
)

// Relay transaction outcomes (onceflow.outcome).
const (
	outcomeCommitted = "committed"
	outcomeAborted   = "aborted"
	outcomeUnknown   = "unknown"
	outcomeFenced    = "fenced"
	outcomeLeaseLost = "lease_lost"
	outcomeRefused   = "refused"
)

// w3c is the propagation format of the envelope: traceparent and tracestate
// headers, whatever the process's global propagator is.
var w3c = propagation.TraceContext{}

func tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(TracerName)
}

// startEnqueue starts the "enqueue" span of one Enqueue or EnqueueBatch call
// and fills in the trace context of every message that has none of its own:
// the enqueue span's when it is recorded, else the span context ctx carried
// (tracing off here, or sampled out, must not cut the caller's trace).
func (w Writer) startEnqueue(ctx context.Context, msgs []Message) (context.Context, trace.Span) {
	parent := trace.SpanContextFromContext(ctx)
	name := "enqueue"
	if topic := commonTopic(msgs); topic != "" {
		name += " " + topic
	}
	ctx, span := tracer(w.TracerProvider).Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingSystemKafka, semconv.MessagingOperationTypeCreate,
			semconv.MessagingOperationName("enqueue"))
		if topic := commonTopic(msgs); topic != "" {
			span.SetAttributes(semconv.MessagingDestinationName(topic))
		}
		if len(msgs) == 1 {
			span.SetAttributes(attrSource.String(msgs[0].Source), attrEventType.String(msgs[0].EventType))
		} else {
			span.SetAttributes(semconv.MessagingBatchMessageCount(len(msgs)))
		}
	}
	sc := span.SpanContext()
	if !sc.IsValid() {
		sc = parent
	}
	if !sc.IsValid() {
		return ctx, span
	}
	carrier := propagation.MapCarrier{}
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	for i := range msgs {
		m := &msgs[i]
		if m.Traceparent != "" || m.Tracestate != "" || m.Headers[envelope.HeaderTracestate] != "" {
			continue // the caller's own trace context
		}
		m.Traceparent = carrier[envelope.HeaderTraceparent]
		m.Tracestate = carrier[envelope.HeaderTracestate]
	}
	return ctx, span
}

// endEnqueue records the results (a single message's id and seq) or the error.
func endEnqueue(span trace.Span, res []Result, err error) {
	if span.IsRecording() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else if len(res) == 1 {
			span.SetAttributes(semconv.MessagingMessageID(res[0].EventID), attrSeq.Int64(res[0].Seq))
		}
	}
	span.End()
}

func commonTopic(msgs []Message) string {
	if len(msgs) == 0 {
		return ""
	}
	for _, m := range msgs[1:] {
		if m.Topic != msgs[0].Topic {
			return ""
		}
	}
	return msgs[0].Topic
}

// txnSpan is the span of one Kafka transaction of the relay.
type txnSpan struct {
	ctx  context.Context
	span trace.Span
}

// recovery is what the last recovery did, added as span events to the next
// transaction (the first of the new producer).
type recovery struct {
	checkpointIDs int
	marked        int64
}

// startTxn starts the span of the Kafka transaction that publishes rows:
// a new trace (a batch has no single parent) with a link to each row's
// producer context.
// unmarked is how many ids of the previous batch its checkpoint names too.
func (r *Relay) startTxn(ctx context.Context, rows []row, unmarked int) txnSpan {
	ctx, span := r.tracer.Start(ctx, "relay transaction", trace.WithSpanKind(trace.SpanKindProducer), trace.WithNewRoot())
	if !span.IsRecording() {
		return txnSpan{ctx: ctx, span: span}
	}
	bytes := 0
	for i := range rows {
		w := &rows[i]
		bytes += len(w.payload) + len(w.key)
		tp := w.headers[envelope.HeaderTraceparent]
		if tp == "" {
			continue
		}
		carrier := propagation.MapCarrier{envelope.HeaderTraceparent: tp}
		if ts := w.headers[envelope.HeaderTracestate]; ts != "" {
			carrier[envelope.HeaderTracestate] = ts
		}
		if sc := trace.SpanContextFromContext(w3c.Extract(context.Background(), carrier)); sc.IsValid() {
			span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
				semconv.MessagingMessageID(w.eventID), attrSource.String(w.source), attrSeq.Int64(w.seq),
			}})
		}
	}
	span.SetAttributes(semconv.MessagingSystemKafka, semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("publish"), attrShard.String(r.cfg.Shard), attrTxnID.String(r.txnID),
		attrRows.Int(len(rows)), semconv.MessagingBatchMessageCount(len(rows)), attrBytes.Int(bytes),
		attrCkptIDs.Int(unmarked+len(rows)))
	if rec := r.recovered; rec != nil {
		r.recovered = nil
		span.AddEvent("producer initialised: older producers of the transactional.id are fenced",
			trace.WithAttributes(attrTxnID.String(r.txnID)))
		span.AddEvent("recovered from checkpoint",
			trace.WithAttributes(attrCkptIDs.Int(rec.checkpointIDs), attrMarked.Int64(rec.marked)))
	}
	return txnSpan{ctx: ctx, span: span}
}

// end records the transaction's outcome: committed, aborted, unknown (the
// next producer recovers from the checkpoint), fenced or lease_lost.
func (t txnSpan) end(err error) {
	defer t.span.End()
	if !t.span.IsRecording() {
		return
	}
	if err == nil {
		t.span.SetAttributes(attrOutcome.String(outcomeCommitted))
		return
	}
	outcome := outcomeAborted
	switch {
	case errors.Is(err, ErrLeadershipLost):
		outcome = outcomeLeaseLost
		t.span.AddEvent("lease lost: not committing; a standby takes over")
	case errors.Is(err, kerr.ProducerFenced), errors.Is(err, kerr.InvalidProducerEpoch):
		outcome = outcomeFenced
		t.span.AddEvent("fenced: a newer producer with this transactional.id took over")
	case errors.As(err, new(*refusedError)):
		outcome = outcomeRefused
		t.span.AddEvent("Kafka refused records for good: alone they are tried again, refused alone they are set aside")
	case errors.Is(err, errUnknownOutcome):
		outcome = outcomeUnknown
		t.span.AddEvent("commit outcome unknown: the next producer recovers from the checkpoint")
	}
	t.span.SetAttributes(attrOutcome.String(outcome))
	t.span.RecordError(err)
	t.span.SetStatus(codes.Error, err.Error())
}
