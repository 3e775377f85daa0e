package outbox_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/outbox"
)

type orderPlaced struct {
	OrderID string  `json:"order_id"`
	Total   float64 `json:"total"`
}

// TestEnqueueValue: a Go value is stored as its JSON payload with the JSON
// content type; a value that does not encode, or a message that already has
// a payload, is refused before anything is written.
func TestEnqueueValue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := outbox.Message{Topic: "orders", Source: "order-1", EventType: "order.placed"}
	var res outbox.Result
	err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = outbox.EnqueueValue(b.ctx, tx, m, orderPlaced{OrderID: "order-1", Total: 12.5})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var payload, ct string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT convert_from(payload, 'UTF8'), content_type FROM onceflow.outbox WHERE event_id = $1`, res.EventID).Scan(&payload, &ct); err != nil {
		t.Fatal(err)
	}
	if payload != `{"order_id":"order-1","total":12.5}` || ct != envelope.ContentTypeJSON || res.Seq != 1 {
		t.Fatalf("stored payload %s, content type %q, seq %d", payload, ct, res.Seq)
	}

	for name, try := range map[string]func(tx pgx.Tx) error{
		"value that does not encode": func(tx pgx.Tx) error {
			_, err := outbox.EnqueueValue(b.ctx, tx, m, map[string]any{"c": make(chan int)})
			return err
		},
		"payload already set": func(tx pgx.Tx) error {
			m := m
			m.Payload = []byte(`{}`)
			_, err := outbox.EnqueueValue(b.ctx, tx, m, orderPlaced{})
			return err
		},
	} {
		err := pgx.BeginFunc(b.ctx, b.db.Pool, try)
		var fe *outbox.FieldError
		if !errors.As(err, &fe) || fe.Field != "payload" {
			t.Fatalf("%s: got %v, want a *FieldError for payload", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("outbox rows %d (%v), want only the first", n, err)
	}
}

// upper is a codec with a content type of its own.
type upper struct{}

func (upper) ContentType() string                { return "text/plain" }
func (upper) Marshal(v any) ([]byte, error)      { return []byte(v.(string)), nil }
func (upper) Unmarshal(data []byte, v any) error { *v.(*string) = string(data); return nil }

// TestEncodeCodec: Encode takes the codec's content type and refuses a
// message that names another.
func TestEncodeCodec(t *testing.T) {
	t.Parallel()
	m := outbox.Message{Topic: "notes", Source: "s", EventType: "note"}
	got, err := outbox.Encode(m, "hello", upper{})
	if err != nil || string(got.Payload) != "hello" || got.ContentType != "text/plain" {
		t.Fatalf("Encode: %+v, %v", got, err)
	}
	m.ContentType = "application/json"
	_, err = outbox.Encode(m, "hello", upper{})
	var fe *outbox.FieldError
	if !errors.As(err, &fe) || fe.Field != envelope.HeaderContentType {
		t.Fatalf("Encode with a content type the codec does not make: %v", err)
	}
}
