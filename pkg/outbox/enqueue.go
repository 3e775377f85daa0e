package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/envelope"
)

// Message is one event to enqueue.
type Message struct {
	// Topic is the Kafka topic the relay publishes the event to (required).
	Topic string
	// Source is the ordering unit: events of one source get gap-free,
	// increasing seqs and reach the topic in seq order (required). Producers
	// of one source serialize until commit, so choose the narrowest unit whose
	// order matters (an aggregate, an order id, an agent thread).
	Source string
	// EventType names what happened, e.g. "order.created" (required).
	EventType string
	// Payload is the record value. It must be valid JSON when ContentType is
	// JSON (the default).
	Payload []byte
	// EventID is an optional natural key such as
	// "billing:order-88:refund_issued"; empty means a generated UUID.
	EventID string
	// ContentType of the payload; empty means application/json.
	ContentType string
	// Key is the record key; empty means the source. A key other than the
	// source may put one source's events on several partitions, which loses
	// the per-partition order (consumers then order by seq).
	Key []byte
	// Headers are extra application headers; the envelope's names are reserved.
	Headers map[string]string
	// Traceparent is an optional W3C trace context carried as a header.
	Traceparent string
}

// Result is what Enqueue allocated.
type Result struct {
	EventID string
	Seq     int64
}

// Writer enqueues events. The zero value is ready to use.
type Writer struct {
	// MaxPayloadBytes bounds a payload (default envelope.DefaultMaxPayloadBytes, 1 MiB).
	MaxPayloadBytes int
	// PayloadSchemas, when set, refuses a payload that violates the JSON
	// Schema declared for its event type (envelope.LoadPayloadSchemas); the
	// *envelope.PayloadError names the violation. Types without a schema
	// pass. Default: none.
	PayloadSchemas *envelope.PayloadSchemas
}

// Enqueue inserts msg into the outbox inside tx with the zero Writer.
func Enqueue(ctx context.Context, tx pgx.Tx, msg Message) (Result, error) {
	return Writer{}.Enqueue(ctx, tx, msg)
}

// EnqueueBatch inserts msgs inside tx with the zero Writer.
func EnqueueBatch(ctx context.Context, tx pgx.Tx, msgs []Message) ([]Result, error) {
	return Writer{}.EnqueueBatch(ctx, tx, msgs)
}

// Enqueue inserts msg into the outbox inside tx and returns its event id and
// seq. The event is published when tx commits and is never published if tx
// rolls back. Invalid input is refused with a *FieldError naming the field;
// an EventID that already exists gives a *DuplicateEventError (and aborts tx).
func (w Writer) Enqueue(ctx context.Context, tx pgx.Tx, msg Message) (Result, error) {
	args, err := w.args(msg)
	if err != nil {
		return Result{}, err
	}
	var r Result
	if err := tx.QueryRow(ctx, enqueueSQL, args...).Scan(&r.EventID, &r.Seq); err != nil {
		return Result{}, interpretEnqueueError(err, msg.EventID)
	}
	return r, nil
}

// EnqueueBatch inserts msgs in one round trip. It locks the sources' counters
// in sorted order (stable: one source's messages keep their order), so two
// batches touching the same sources cannot deadlock each other; they can
// still deadlock with a transaction that enqueued in another order, which
// fails with SQLSTATE 40P01 (IsRetryable): retry the whole transaction.
// Results are in the order of msgs.
func (w Writer) EnqueueBatch(ctx context.Context, tx pgx.Tx, msgs []Message) ([]Result, error) {
	order := make([]int, len(msgs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return msgs[order[a]].Source < msgs[order[b]].Source })
	var b pgx.Batch
	for _, i := range order {
		args, err := w.args(msgs[i])
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		b.Queue(enqueueSQL, args...)
	}
	res := make([]Result, len(msgs))
	br := tx.SendBatch(ctx, &b)
	for _, i := range order {
		if err := br.QueryRow().Scan(&res[i].EventID, &res[i].Seq); err != nil {
			_ = br.Close()
			return nil, interpretEnqueueError(err, msgs[i].EventID)
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	return res, nil
}

// args validates msg with the envelope's rules and returns the statement's arguments.
func (w Writer) args(msg Message) ([]any, error) {
	if err := CheckTopic(msg.Topic); err != nil {
		return nil, err
	}
	env := envelope.Envelope{
		EventID:     msg.EventID,
		Source:      msg.Source,
		Seq:         1, // allocated by the statement
		EventType:   msg.EventType,
		ContentType: msg.ContentType,
		Traceparent: msg.Traceparent,
		Key:         msg.Key,
		Headers:     msg.Headers,
		Payload:     msg.Payload,
	}
	if env.EventID == "" {
		env.EventID = "generated" // checked only when given
	}
	if err := env.Validate(w.MaxPayloadBytes); err != nil {
		return nil, err
	}
	if err := w.PayloadSchemas.Validate(msg.EventType, msg.ContentType, msg.Payload); err != nil {
		return nil, err
	}
	if msg.Payload == nil {
		msg.Payload = []byte{}
	}
	ct := msg.ContentType
	if ct == "" {
		ct = envelope.ContentTypeJSON
	}
	var hs map[string]string
	if len(msg.Headers) > 0 || msg.Traceparent != "" {
		hs = make(map[string]string, len(msg.Headers)+1)
		for k, v := range msg.Headers {
			hs[k] = v
		}
		if msg.Traceparent != "" {
			hs[envelope.HeaderTraceparent] = msg.Traceparent
		}
	}
	headers := []byte("{}")
	if hs != nil {
		var err error
		if headers, err = json.Marshal(hs); err != nil {
			return nil, &FieldError{Field: "headers", Reason: err.Error()}
		}
	}
	var eventID, key any
	if msg.EventID != "" {
		eventID = msg.EventID
	}
	if len(msg.Key) > 0 {
		key = msg.Key
	}
	return []any{eventID, msg.Topic, msg.Source, msg.EventType, ct, key, string(headers), msg.Payload}, nil
}
