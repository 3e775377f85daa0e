package inbox

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// Event is one decoded event as a handler sees it: the envelope (event id,
// source, seq, type, content type, traceparent, record key, extra headers,
// payload, the record's timestamp) plus where the record was read from.
type Event struct {
	envelope.Envelope

	Topic     string
	Partition int32
	Offset    int64

	// Late is set when the sequence guard delivers an event that arrived
	// after its gap was given up. The arrival-order guard never sets it.
	Late bool

	// Raw is the record as it was fetched, before pkg/wire turned it into
	// the JSON view the Envelope holds: for a topic in avro, protobuf or
	// json-schema its value is the registry-framed bytes, for CloudEvents
	// its headers are the ce_* attributes. For a Go handler that wants the
	// producer's encoding; read it, do not change it. Nil for an event the
	// sequence guard parked and delivered from the inbox later (the inbox
	// keeps the JSON view only).
	Raw *kgo.Record

	// span is the event's process span (nil with tracing off); see
	// EventContext.
	span trace.Span
	// prep is what Effecter.Effect returned for the event (see Prepared).
	prep *Preparation
}

// stream is the event's sequence-guard stream: (producer, topic, source),
// or the source's legacy stream when the record has no producer header.
func (ev *Event) stream() seqguard.Stream {
	return seqguard.StreamOf(ev.Producer, ev.Topic, ev.Source)
}

func eventFromEnvelope(e envelope.Envelope, topic string, partition int32, offset int64) Event {
	return Event{Envelope: e, Topic: topic, Partition: partition, Offset: offset}
}

// Handler applies one event. It runs inside the inbox transaction: every
// write it makes through tx commits together with the event's inbox row and
// the partition's next offset, or not at all. A returned error (or a panic)
// rolls the transaction back; the event is retried and finally dead-lettered.
//
// A handler must not commit or roll back tx, and must not keep it after
// returning. Side effects outside tx (HTTP calls, e-mails) are not covered by
// the transaction: fence them with an idempotency key derived from
// ev.EventID.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, ev Event) error
}

// BatchHandler applies several events of one partition at once, in the order
// given (offset order after the sequence guard). It lets a handler pipeline
// its statements with a pgx.Batch. When it fails, the consumer retries the
// events one at a time (a slice of one) to isolate the failing event.
type BatchHandler interface {
	HandleBatch(ctx context.Context, tx pgx.Tx, evs []Event) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, ev Event) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, ev Event) error { return f(ctx, tx, ev) }

// perEvent adapts a Handler to BatchHandler.
type perEvent struct{ h Handler }

func (p perEvent) HandleBatch(ctx context.Context, tx pgx.Tx, evs []Event) error {
	for i := range evs {
		if err := p.h.Handle(EventContext(ctx, evs[i]), tx, evs[i]); err != nil {
			return &HandlerError{EventID: evs[i].EventID, Err: err}
		}
	}
	return nil
}

// asBatch returns h as a BatchHandler, preferring its own batch form.
func asBatch(h Handler) BatchHandler {
	if b, ok := h.(BatchHandler); ok {
		return b
	}
	return perEvent{h}
}

type consumerNameKey struct{}

// withConsumerName tells the handlers which logical consumer runs them (the
// http handler scopes its effects by it).
func withConsumerName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, consumerNameKey{}, name)
}

// ConsumerName is the logical consumer running the handler that got ctx
// (DefaultConsumerName when a caller ran the handler outside the engine).
// Handlers that keep state of their own per consumer scope it by this name
// (the handler file's http handlers scope their effects by it).
func ConsumerName(ctx context.Context) string {
	if v, ok := ctx.Value(consumerNameKey{}).(string); ok && v != "" {
		return v
	}
	return DefaultConsumerName
}
