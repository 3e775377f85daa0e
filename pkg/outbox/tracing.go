package outbox

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/envelope/spec"
)

// Tracing (see docs/tracing.md). Everything OpenTelemetry touches in this
// package is in this file: the "enqueue" span and the trace context a
// message takes from ctx. The relay's spans (pkg/relay) use the same
// instrumentation scope, TracerName.

// TracerName is the instrumentation scope of this package's spans.
const TracerName = "github.com/onceflow/onceflow/pkg/outbox"

// Span attribute keys of onceflow's own (the rest are OpenTelemetry
// semantic conventions).
const (
	attrSource    = attribute.Key("onceflow.source")
	attrSeq       = attribute.Key("onceflow.seq")
	attrEventType = attribute.Key("onceflow.event_type")
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
		if m.Traceparent != "" || m.Tracestate != "" || m.Headers[spec.HeaderTracestate] != "" {
			continue // the caller's own trace context
		}
		m.Traceparent = carrier[spec.HeaderTraceparent]
		m.Tracestate = carrier[spec.HeaderTracestate]
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
