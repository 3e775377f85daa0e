package relay

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
	"github.com/onceflow/onceflow/pkg/outbox"
)

// Tracing (see docs/tracing.md): the "relay transaction" span of each Kafka
// transaction, with a link to each event's producer context. The spans
// share the producer API's instrumentation scope, outbox.TracerName.

// Span attribute keys of onceflow's own (the rest are OpenTelemetry
// semantic conventions).
const (
	attrSource  = attribute.Key("onceflow.source")
	attrSeq     = attribute.Key("onceflow.seq")
	attrShard   = attribute.Key("onceflow.shard")
	attrRows    = attribute.Key("onceflow.rows")
	attrBytes   = attribute.Key("onceflow.bytes")
	attrOutcome = attribute.Key("onceflow.outcome")
	attrCkptIDs = attribute.Key("onceflow.checkpoint_ids")
	attrMarked  = attribute.Key("onceflow.marked")
	attrTxnID   = attribute.Key("onceflow.transactional_id")
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
	return tp.Tracer(outbox.TracerName)
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
func (p *publisher) startTxn(ctx context.Context, rows []row, unmarked int) txnSpan {
	ctx, span := p.tracer.Start(ctx, "relay transaction", trace.WithSpanKind(trace.SpanKindProducer), trace.WithNewRoot())
	if !span.IsRecording() {
		return txnSpan{ctx: ctx, span: span}
	}
	txnID := ""
	if p.prod != nil {
		txnID = p.prod.txnID
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
		semconv.MessagingOperationName("publish"), attrShard.String(p.cfg.Shard), attrTxnID.String(txnID),
		attrRows.Int(len(rows)), semconv.MessagingBatchMessageCount(len(rows)), attrBytes.Int(bytes),
		attrCkptIDs.Int(unmarked+len(rows)))
	if rec := p.recovered; rec != nil {
		p.recovered = nil
		span.AddEvent("producer initialised: older producers of the transactional.id are fenced",
			trace.WithAttributes(attrTxnID.String(txnID)))
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
