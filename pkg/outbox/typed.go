package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/envelope/spec"
)

// EnqueueValue enqueues v, encoded as JSON (spec.JSONCodec), as the
// payload of msg inside tx: Enqueue(ctx, tx, Encode(msg, v, nil)). msg
// names the topic, source and event type; its Payload must be empty. A
// value that does not encode is refused with a *FieldError (field
// "payload") naming its Go type, before anything is written.
func EnqueueValue[T any](ctx context.Context, tx pgx.Tx, msg Message, v T) (Result, error) {
	m, err := Encode(msg, v, nil)
	if err != nil {
		return Result{}, err
	}
	return Enqueue(ctx, tx, m)
}

// Encode returns msg with v encoded by codec as its Payload and the codec's
// content type as its ContentType (nil codec: spec.JSONCodec). Use it
// with another codec, with a Writer (schemas, payload limit), with
// EnqueueBatch or with package outboxsql. msg's Payload must be empty, and
// its ContentType empty or the codec's.
func Encode(msg Message, v any, codec spec.Codec) (Message, error) {
	if codec == nil {
		codec = spec.JSONCodec{}
	}
	if len(msg.Payload) > 0 {
		return Message{}, &FieldError{Field: "payload", Reason: "is set: give the value to encode instead"}
	}
	ct := codec.ContentType()
	if msg.ContentType != "" && msg.ContentType != ct {
		return Message{}, &FieldError{Field: spec.HeaderContentType, Reason: fmt.Sprintf("is %q but the codec encodes %q", msg.ContentType, ct)}
	}
	b, err := codec.Marshal(v)
	if err != nil {
		return Message{}, &FieldError{Field: "payload", Reason: fmt.Sprintf("encode %T as %s: %v", v, ct, err)}
	}
	msg.Payload, msg.ContentType = b, ct
	return msg, nil
}
