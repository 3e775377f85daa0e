package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/envelope/spec"
)

// Message is one event to enqueue.
type Message struct {
	// Topic is the Kafka topic the relay publishes the event to (required).
	Topic string
	// Source is the ordering unit: the events of one source on one topic
	// (a stream) get gap-free, increasing seqs (1, 2, 3, … per source and
	// topic) and reach the topic in seq order (required). Producers of one
	// stream serialize until commit, so choose the narrowest unit whose
	// order matters (an aggregate, an order id, an agent thread).
	Source string
	// EventType names what happened, e.g. "order.created" (required).
	EventType string
	// Payload is the record value. It must be valid JSON when ContentType is
	// JSON (the default).
	Payload []byte
	// EventID is an optional natural key such as
	// "billing:order-88:refund_issued"; empty means a generated UUID
	// (version 7: time-ordered).
	EventID string
	// ContentType of the payload; empty means application/json.
	ContentType string
	// Key is the record key; empty means the source. A key other than the
	// source may put one source's events on several partitions, which loses
	// the per-partition order (consumers then order by seq).
	Key []byte
	// Headers are extra application headers; the envelope's names are reserved.
	Headers map[string]string
	// Traceparent is the W3C trace context the event carries as a header.
	// Empty means the span context of the ctx given to Enqueue (that of
	// its "enqueue" span when tracing records it), if ctx carries one.
	Traceparent string
	// Tracestate is the W3C tracestate that goes with Traceparent (carried
	// as the header "tracestate"). It needs a Traceparent; it is taken from
	// ctx together with the traceparent when Traceparent is empty.
	Tracestate string
}

// Result is what Enqueue allocated.
type Result struct {
	EventID string
	Seq     int64
}

// Writer enqueues events. The zero value is ready to use.
type Writer struct {
	// MaxPayloadBytes bounds a payload (default spec.DefaultMaxPayloadBytes, 1 MiB).
	MaxPayloadBytes int
	// PayloadSchemas, when set, refuses a payload that violates the JSON
	// Schema declared for its event type (spec.LoadPayloadSchemas); the
	// *spec.PayloadError names the violation. Types without a schema
	// pass. Default: none.
	PayloadSchemas *spec.PayloadSchemas
	// PayloadCheck, when set, is asked whether a payload fits its topic's
	// wire format before anything is written; its error refuses the event
	// and is returned as it is. (*wire.Encoder).Check fits: with the
	// relay's topic spec and registry it refuses a payload that does not
	// fit an avro, protobuf or json-schema topic's schema at enqueue,
	// instead of the relay setting the row aside as schema_mismatch.
	// Default: none.
	PayloadCheck func(topic string, payload []byte) error
	// TracerProvider makes the "enqueue" span of each call (see
	// docs/tracing.md). Default: the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
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
//
// Unless msg has a Traceparent of its own, the event carries the trace
// context of ctx, so that the relay and the consumer continue the caller's
// trace.
func (w Writer) Enqueue(ctx context.Context, tx pgx.Tx, msg Message) (r Result, err error) {
	msgs := []Message{msg}
	ctx, span := w.startEnqueue(ctx, msgs)
	defer func() { endEnqueue(span, []Result{r}, err) }()
	msg = msgs[0]
	args, err := w.args(msg)
	if err != nil {
		return Result{}, err
	}
	if err := tx.QueryRow(ctx, qEnqueue, args...).Scan(&r.EventID, &r.Seq); err != nil {
		return Result{}, interpretEnqueueError(err, msg.EventID)
	}
	return r, nil
}

// EnqueueBatch inserts msgs in one statement; the rows of one stream
// (source and topic) take consecutive seqs in their order in msgs. It locks
// the streams' counters in sorted order, by source then topic (stable: one
// stream's messages keep their order, and ids follow streams in sorted
// order), so two batches touching the same streams cannot deadlock each
// other; they can still deadlock with a transaction that enqueued in another
// order, which fails with SQLSTATE 40P01 (IsRetryable): retry the whole
// transaction. Results are in the order of msgs. One "enqueue" span covers
// the call; messages without a Traceparent of their own carry its trace
// context.
func (w Writer) EnqueueBatch(ctx context.Context, tx pgx.Tx, msgs []Message) (res []Result, err error) {
	msgs = slices.Clone(msgs)
	ctx, span := w.startEnqueue(ctx, msgs)
	defer func() { endEnqueue(span, res, err) }()
	n := len(msgs)
	var (
		eventIDs    = make([]string, n)
		topics      = make([]string, n)
		sources     = make([]string, n)
		types       = make([]string, n)
		contentType = make([]string, n)
		keys        = make([][]byte, n)
		headers     = make([]string, n)
		payloads    = make([][]byte, n)
	)
	for i, m := range msgs {
		args, err := w.args(m)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		// args: event id, topic, source, event type, content type, key, headers, payload.
		eventIDs[i], topics[i], sources[i], types[i], contentType[i] = args[0].(string), args[1].(string), args[2].(string), args[3].(string), args[4].(string)
		if k, ok := args[5].([]byte); ok {
			keys[i] = k
		}
		headers[i], payloads[i] = args[6].(string), args[7].([]byte)
	}
	if n == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, qEnqueueBatch, eventIDs, topics, sources, types, contentType, keys, headers, payloads)
	if err != nil {
		return nil, interpretEnqueueError(err, "")
	}
	// Each stream's first seq; its messages took it and the ones after it,
	// in their order.
	type stream struct{ source, topic string }
	next := map[stream]int64{}
	for rows.Next() {
		var st stream
		var seq int64
		if err := rows.Scan(&st.source, &st.topic, &seq); err != nil {
			rows.Close()
			return nil, fmt.Errorf("enqueue: %w", err)
		}
		next[st] = seq
	}
	if err := rows.Err(); err != nil {
		return nil, interpretEnqueueError(err, "")
	}
	res = make([]Result, n)
	for i := range msgs {
		st := stream{sources[i], topics[i]}
		seq, ok := next[st]
		if !ok {
			return nil, fmt.Errorf("enqueue: no seq allocated for source %q on topic %q", st.source, st.topic)
		}
		res[i] = Result{EventID: eventIDs[i], Seq: seq}
		next[st] = seq + 1
	}
	return res, nil
}

// args validates msg with the envelope's rules and returns the statement's arguments.
func (w Writer) args(msg Message) ([]any, error) {
	if err := CheckTopic(msg.Topic); err != nil {
		return nil, err
	}
	env := spec.Fields{
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
	if w.PayloadCheck != nil {
		if err := w.PayloadCheck(msg.Topic, msg.Payload); err != nil {
			return nil, err
		}
	}
	if msg.Payload == nil {
		msg.Payload = []byte{}
	}
	tracestate := msg.Tracestate
	if v, ok := msg.Headers[spec.HeaderTracestate]; ok {
		if tracestate != "" {
			return nil, &FieldError{Field: spec.HeaderTracestate, Reason: "is set both as Tracestate and in Headers"}
		}
		tracestate = v
	}
	if tracestate != "" {
		if msg.Traceparent == "" {
			return nil, &FieldError{Field: spec.HeaderTracestate, Reason: "needs a traceparent"}
		}
		if err := spec.CheckTracestate(tracestate); err != nil {
			return nil, err
		}
	}
	ct := msg.ContentType
	if ct == "" {
		ct = spec.ContentTypeJSON
	}
	var hs map[string]string
	if len(msg.Headers) > 0 || msg.Traceparent != "" {
		hs = make(map[string]string, len(msg.Headers)+2)
		for k, v := range msg.Headers {
			hs[k] = v
		}
		if msg.Traceparent != "" {
			hs[spec.HeaderTraceparent] = msg.Traceparent
		}
		if tracestate != "" {
			hs[spec.HeaderTracestate] = tracestate
		}
	}
	headers := []byte("{}")
	if hs != nil {
		var err error
		if headers, err = json.Marshal(hs); err != nil {
			return nil, &FieldError{Field: "headers", Reason: err.Error()}
		}
	}
	eventID := msg.EventID
	if eventID == "" {
		eventID = NewEventID()
	}
	var key any
	if len(msg.Key) > 0 {
		key = msg.Key
	}
	return []any{eventID, msg.Topic, msg.Source, msg.EventType, ct, key, string(headers), msg.Payload}, nil
}

// NewEventID returns the event id Enqueue generates when a message has
// none: a UUID version 7 (RFC 9562), 48 bits of Unix milliseconds and then
// random bits, in lower case. Ids that grow with time land at the right
// edge of the outbox's event_id index, and of a consumer's inbox key,
// instead of on a random page of an index that outgrows memory; and a
// consumer's dedup probe of such an id reads only the inbox buckets from
// its time on (docs/consumer.md). Use it to know an event's id before
// enqueueing it.
func NewEventID() string {
	var b [16]byte
	ms := uint64(time.Now().UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	_, _ = rand.Read(b[6:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x70 // version 7
	b[8] = b[8]&0x3f | 0x80 // variant 10
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}
