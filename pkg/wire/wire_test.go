package wire_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/wire"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
)

const (
	avroSchema = `{"type":"record","name":"Order","namespace":"shop","fields":[
 {"name":"id","type":"string"},{"name":"qty","type":"int"},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"tags","type":{"type":"array","items":"string"},"default":[]}]}`
	protoSchema = `syntax = "proto3";
package shop;
message Order { string id = 1; int32 qty = 2; string note = 3; repeated string tags = 4; }`
	jsonSchema = `{"type":"object","required":["id","qty"],"properties":{"id":{"type":"string"},"qty":{"type":"integer"},"note":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}},"additionalProperties":false}`
)

func sameJSON(t *testing.T, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got %s: %v", got, err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("JSON view = %s, want %s", got, want)
	}
}

func testEnvelope(seq int64, payload string) envelope.Envelope {
	return envelope.Envelope{
		EventID: fmt.Sprintf("0190e0e2-0000-7000-8000-%012d", seq), Source: "order-7", Seq: seq,
		EventType: "order.placed", Producer: "db-1", Payload: []byte(payload),
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		Headers:     map[string]string{"tenant": "acme"},
	}
}

// registry returns a client of the test registry and a unique subject prefix.
func registry(t *testing.T) (*sr.Client, string) {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(testkit.SchemaRegistryURL(t)))
	if err != nil {
		t.Fatal(err)
	}
	return cl, fmt.Sprintf("wire-test-%d", time.Now().UnixNano())
}

// TestRoundTripRegistered: each registered format encodes the JSON payload
// with the registry's schema id in Confluent framing, refuses a payload that
// does not fit, and decodes back to the same JSON view through the
// registry alone (the decoder is told nothing about the topic).
func TestRoundTripRegistered(t *testing.T) {
	ctx := context.Background()
	cl, prefix := registry(t)
	for _, tc := range []struct {
		f        wire.Format
		schema   string
		payload  string
		view     string
		misfit   string
		magicLen int
	}{
		{wire.FormatAvro, avroSchema, `{"id":"o-1","qty":3,"note":"gift"}`, `{"id":"o-1","qty":3,"note":"gift","tags":[]}`, `{"id":"o-1","qty":"three"}`, 5},
		{wire.FormatProtobuf, protoSchema, `{"id":"o-1","qty":3,"note":"gift"}`, `{"id":"o-1","qty":3,"note":"gift","tags":[]}`, `{"id":"o-1","qty":"three"}`, 6},
		{wire.FormatJSONSchema, jsonSchema, `{"id":"o-1","qty":3,"note":"gift"}`, `{"id":"o-1","qty":3,"note":"gift"}`, `{"id":"o-1"}`, 5},
	} {
		t.Run(string(tc.f), func(t *testing.T) {
			topic := prefix + "-" + string(tc.f)
			tf := wire.TopicFormat{Format: tc.f, Schema: tc.schema}
			if _, err := wire.NewEncoder(ctx, cl, map[string]wire.TopicFormat{topic: tf}); !errors.Is(err, wire.ErrNotRegistered) {
				t.Fatalf("NewEncoder before registration: %v, want ErrNotRegistered", err)
			}
			ss, err := wire.Register(ctx, cl, topic, tf, wire.CompatBackward)
			if err != nil {
				t.Fatalf("Register: %v", err)
			}
			enc, err := wire.NewEncoder(ctx, cl, map[string]wire.TopicFormat{topic: tf})
			if err != nil {
				t.Fatal(err)
			}
			env := testEnvelope(1, tc.payload)
			rec, err := enc.Record(&env, topic)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Value[0] != 0 || int(rec.Value[1])<<24|int(rec.Value[2])<<16|int(rec.Value[3])<<8|int(rec.Value[4]) != ss.ID {
				t.Fatalf("value starts % x, want magic 0 and schema id %d", rec.Value[:5], ss.ID)
			}
			if got := header(rec, wire.HeaderContractVersion); got != wire.ContractVersion {
				t.Fatalf("contract-version = %q", got)
			}
			bad := testEnvelope(2, tc.misfit)
			var pe *wire.PayloadError
			if _, err := enc.Record(&bad, topic); !errors.As(err, &pe) {
				t.Fatalf("misfit payload: %v, want *PayloadError", err)
			}
			if err := enc.Check(topic, bad.Payload); !errors.As(err, &pe) {
				t.Fatalf("Check(misfit) = %v", err)
			}
			rec.Topic, rec.Offset = topic, 41
			dec := &wire.Decoder{Registry: cl}
			view, err := dec.View(ctx, rec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := envelope.Decode(view, 0)
			if err != nil {
				t.Fatal(err)
			}
			sameJSON(t, got.Payload, []byte(tc.view))
			if got.EventID != env.EventID || got.Seq != 1 || got.Source != env.Source || got.ContentType != "application/json" || got.Headers["tenant"] != "acme" {
				t.Fatalf("decoded %+v", got)
			}
			if _, err := (&wire.Decoder{}).View(ctx, rec); err == nil {
				t.Fatal("a framed record without a registry decoded")
			}
			// Another producer's Confluent serializer writes neither
			// wire-format nor a content type: the magic byte is enough.
			bare := *rec
			bare.Headers = nil
			for _, h := range rec.Headers {
				if h.Key != wire.HeaderWireFormat && h.Key != "content-type" {
					bare.Headers = append(bare.Headers, h)
				}
			}
			view, err = dec.View(ctx, &bare)
			if err != nil {
				t.Fatalf("framed record without format headers: %v", err)
			}
			if got, err := envelope.Decode(view, 0); err != nil {
				t.Fatalf("framed record without format headers: %v", err)
			} else {
				sameJSON(t, got.Payload, []byte(tc.view))
			}
		})
	}
}

// TestIncompatibleChangeRefused: with BACKWARD compatibility a new schema
// that drops a required field's default-less type change is refused by
// Register before anything is written.
func TestIncompatibleChangeRefused(t *testing.T) {
	ctx := context.Background()
	cl, prefix := registry(t)
	topic := prefix + "-compat"
	v1 := wire.TopicFormat{Format: wire.FormatAvro, Schema: avroSchema}
	if _, err := wire.Register(ctx, cl, topic, v1, wire.CompatBackward); err != nil {
		t.Fatal(err)
	}
	// A new required field without a default: old records cannot be read.
	v2 := wire.TopicFormat{Format: wire.FormatAvro, Schema: `{"type":"record","name":"Order","namespace":"shop","fields":[
 {"name":"id","type":"string"},{"name":"qty","type":"int"},{"name":"currency","type":"string"}]}`}
	_, err := wire.Register(ctx, cl, topic, v2, wire.CompatBackward)
	var ie *wire.IncompatibleError
	if !errors.As(err, &ie) {
		t.Fatalf("Register(incompatible) = %v, want *IncompatibleError", err)
	}
	vs, err := cl.SubjectVersions(ctx, v1.SubjectFor(topic))
	if err != nil || len(vs) != 1 {
		t.Fatalf("versions after the refused change = %v, %v; want one", vs, err)
	}
	// A compatible change (a field with a default) is registered.
	v3 := wire.TopicFormat{Format: wire.FormatAvro, Schema: `{"type":"record","name":"Order","namespace":"shop","fields":[
 {"name":"id","type":"string"},{"name":"qty","type":"int"},
 {"name":"note","type":["null","string"],"default":null},
 {"name":"tags","type":{"type":"array","items":"string"},"default":[]},
 {"name":"currency","type":"string","default":"EUR"}]}`}
	if _, err := wire.Register(ctx, cl, topic, v3, wire.CompatBackward); err != nil {
		t.Fatalf("compatible change: %v", err)
	}
}

func header(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}
