package wire_test

import (
	"context"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/contract"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/wire"
	"github.com/twmb/franz-go/pkg/kgo"
)

func ceRecord(hs ...string) *kgo.Record {
	r := &kgo.Record{Topic: "t", Offset: 9, Value: []byte(`{"n":1}`)}
	for i := 0; i < len(hs); i += 2 {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: hs[i], Value: []byte(hs[i+1])})
	}
	return r
}

// TestCloudEventsBinary: onceflow's own binary CloudEvents round-trip to the
// same envelope; a foreign producer's ce_* headers map to source, type and
// seq, with an event id that keys dedup by (source, id).
func TestCloudEventsBinary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	enc, err := wire.NewEncoder(ctx, nil, map[string]wire.TopicFormat{"t": {CloudEvents: wire.CloudEventsBinary}})
	if err != nil {
		t.Fatal(err)
	}
	env := testEnvelope(12, `{"n":1}`)
	rec, err := enc.Record(&env, "t")
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"ce_specversion": "1.0", "ce_id": env.EventID, "ce_source": "order-7", "ce_type": "order.placed",
		"ce_sequence": "0000000000000000012", "content-type": "application/json", "contract-version": wire.ContractVersion,
		"traceparent": env.Traceparent, "event-id": "", "seq": "",
	} {
		if got := header(rec, k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	view, err := (&wire.Decoder{}).View(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := envelope.Decode(view, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.EventID != env.EventID || got.Seq != 12 || got.Source != "order-7" || got.EventType != "order.placed" || got.Producer != "db-1" {
		t.Fatalf("own CloudEvent decoded as %+v", got)
	}

	for _, tc := range []struct {
		name    string
		rec     *kgo.Record
		arrival bool
		wantID  string
		wantSeq int64
		bad     string
	}{
		{"foreign", ceRecord("ce_specversion", "1.0", "ce_id", "42", "ce_source", "/shop/eu", "ce_type", "order.paid", "ce_sequence", "7", "content-type", "application/json"),
			false, "ce:8:/shop/eu:42", 7, ""},
		{"padded sequence", ceRecord("ce_specversion", "1.0", "ce_id", "a", "ce_source", "s", "ce_type", "x", "ce_sequence", "000000012"),
			false, "ce:1:s:a", 12, ""},
		{"no sequence, seq order", ceRecord("ce_specversion", "1.0", "ce_id", "a", "ce_source", "s", "ce_type", "x"), false, "", 0, "ce_sequence"},
		{"no sequence, arrival order", ceRecord("ce_specversion", "1.0", "ce_id", "a", "ce_source", "s", "ce_type", "x"), true, "ce:1:s:a", 10, ""},
		{"no id", ceRecord("ce_specversion", "1.0", "ce_source", "s", "ce_type", "x", "ce_sequence", "1"), false, "", 0, "ce_id"},
		{"sequence not numeric", ceRecord("ce_specversion", "1.0", "ce_id", "a", "ce_source", "s", "ce_type", "x", "ce_sequence", "abc"), false, "", 0, "ce_sequence"},
		{"later contract major", ceRecord("ce_specversion", "1.0", "ce_id", "a", "ce_source", "s", "ce_type", "x", "ce_sequence", "1", "contract-version", "2.0.0"), false, "", 0, "contract-version"},
	} {
		view, err := (&wire.Decoder{SeqFromOffset: tc.arrival}).View(ctx, tc.rec)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("%s: err = %v, want one naming %s", tc.name, err, tc.bad)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		got, err := envelope.Decode(view, 0)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got.EventID != tc.wantID || got.Seq != tc.wantSeq {
			t.Errorf("%s: event id %q seq %d, want %q %d", tc.name, got.EventID, got.Seq, tc.wantID, tc.wantSeq)
		}
	}
}

// TestCloudEventsStructured: a structured-mode record carries the event as a
// JSON object and decodes to the same envelope.
func TestCloudEventsStructured(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	enc, err := wire.NewEncoder(ctx, nil, map[string]wire.TopicFormat{"t": {CloudEvents: wire.CloudEventsStructured}})
	if err != nil {
		t.Fatal(err)
	}
	env := testEnvelope(3, `{"n":1}`)
	rec, err := enc.Record(&env, "t")
	if err != nil {
		t.Fatal(err)
	}
	if ct := header(rec, "content-type"); ct != wire.ContentTypeCloudEventsJSON || !strings.Contains(string(rec.Value), `"data":{"n":1}`) {
		t.Fatalf("structured record: content-type %q value %s", ct, rec.Value)
	}
	view, err := (&wire.Decoder{}).View(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := envelope.Decode(view, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.EventID != env.EventID || got.Seq != 3 || string(got.Payload) != `{"n":1}` || got.Traceparent != env.Traceparent {
		t.Fatalf("decoded %+v", got)
	}
}

func TestTopicFormatValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tf  wire.TopicFormat
		bad string
	}{
		{wire.TopicFormat{}, ""},
		{wire.TopicFormat{Format: "xml"}, "format"},
		{wire.TopicFormat{Format: wire.FormatAvro}, "needs a schema"},
		{wire.TopicFormat{Format: wire.FormatAvro, Schema: `{"type":"nope"}`}, "avro schema"},
		{wire.TopicFormat{Format: wire.FormatProtobuf, Schema: `syntax = "proto3"; message M { int32 a = 1; }`, Message: "N"}, "no message"},
		{wire.TopicFormat{Format: wire.FormatAvro, Schema: avroSchema, CloudEvents: wire.CloudEventsStructured}, "structured"},
		{wire.TopicFormat{Schema: avroSchema}, "not json"},
	} {
		err := tc.tf.Validate()
		if (tc.bad == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("%+v: %v, want %q", tc.tf, err, tc.bad)
		}
	}
}

// The version written on the wire is the contract's (contract/VERSION).
func TestContractVersionMatches(t *testing.T) {
	t.Parallel()
	if v := contract.Version(); v != wire.ContractVersion {
		t.Fatalf("wire.ContractVersion %q, contract/VERSION %q", wire.ContractVersion, v)
	}
}
