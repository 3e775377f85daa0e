package wire_test

import (
	"context"
	"testing"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/wire"
	"github.com/twmb/franz-go/pkg/kgo"
)

// FuzzView: whatever the headers and value, View returns a record or a
// *envelope.MalformedError, never panics, and a view decodes or is refused
// by envelope.Decode with a MalformedError too.
func FuzzView(f *testing.F) {
	f.Add("ce_specversion", "1.0", "ce_sequence", "7", "content-type", "application/cloudevents+json", []byte(`{"id":"a","source":"s","type":"t","sequence":"3","data":{}}`))
	f.Add("wire-format", "avro", "ce_id", "x", "content-type", "application/vnd.confluent.avro", []byte{0, 0, 0, 0, 1, 2})
	f.Add("contract-version", "9.0.0", "seq", "1", "event-id", "e", []byte(`{}`))
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string, value []byte) {
		r := &kgo.Record{Topic: "t", Value: value, Headers: []kgo.RecordHeader{
			{Key: k1, Value: []byte(v1)}, {Key: k2, Value: []byte(v2)}, {Key: k3, Value: []byte(v3)},
			{Key: "ce_id", Value: []byte("i")}, {Key: "ce_source", Value: []byte("s")}, {Key: "ce_type", Value: []byte("t")},
		}}
		view, err := (&wire.Decoder{SeqFromOffset: len(value)%2 == 0}).View(context.Background(), r)
		if err != nil {
			if _, ok := err.(*envelope.MalformedError); !ok {
				t.Fatalf("View error %T %v, want *envelope.MalformedError", err, err)
			}
			return
		}
		if _, err := envelope.Decode(view, 0); err != nil {
			if _, ok := err.(*envelope.MalformedError); !ok {
				t.Fatalf("Decode(view) error %T %v", err, err)
			}
		}
	})
}
