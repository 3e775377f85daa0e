package envelope

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

func validEnvelope() Envelope {
	return Envelope{
		EventID:     "billing:order-88:refund_issued",
		Source:      "order-88",
		Seq:         41,
		EventType:   "billing.refund_issued",
		ContentType: ContentTypeJSON,
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		Headers:     map[string]string{"tenant": "acme", "attempt-hint": "x"},
		Payload:     []byte(`{"order_id":88,"amount":1200}`),
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	in := validEnvelope()
	rec := in.Record("orders")
	if string(rec.Key) != in.Source {
		t.Fatalf("key = %q, want the source %q", rec.Key, in.Source)
	}
	rec.Topic, rec.Partition, rec.Offset = "orders", 3, 99
	out, err := Decode(rec, 0)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if out.EventID != in.EventID || out.Source != in.Source || out.Seq != in.Seq ||
		out.EventType != in.EventType || out.ContentType != in.ContentType ||
		out.Traceparent != in.Traceparent || string(out.Payload) != string(in.Payload) {
		t.Fatalf("round trip changed the envelope:\n in %+v\nout %+v", in, out)
	}
	if len(out.Headers) != 2 || out.Headers["tenant"] != "acme" {
		t.Fatalf("extra headers = %v", out.Headers)
	}
}

func TestExplicitKey(t *testing.T) {
	t.Parallel()
	e := validEnvelope()
	e.Key = []byte("customer-7")
	if got := string(e.Record("t").Key); got != "customer-7" {
		t.Fatalf("key = %q", got)
	}
}

func TestDecodeMalformed(t *testing.T) {
	t.Parallel()
	base := func() *kgo.Record {
		e := validEnvelope()
		r := e.Record("orders")
		r.Partition, r.Offset = 2, 17
		return r
	}
	setHeader := func(r *kgo.Record, name, value string) {
		for i := range r.Headers {
			if r.Headers[i].Key == name {
				r.Headers[i].Value = []byte(value)
				return
			}
		}
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: name, Value: []byte(value)})
	}
	dropHeader := func(r *kgo.Record, name string) {
		hs := r.Headers[:0]
		for _, h := range r.Headers {
			if h.Key != name {
				hs = append(hs, h)
			}
		}
		r.Headers = hs
	}
	cases := []struct {
		name  string
		mod   func(*kgo.Record)
		field string
		max   int
	}{
		{"no event id", func(r *kgo.Record) { dropHeader(r, HeaderEventID) }, HeaderEventID, 0},
		{"empty source", func(r *kgo.Record) { setHeader(r, HeaderSource, "") }, HeaderSource, 0},
		{"no seq", func(r *kgo.Record) { dropHeader(r, HeaderSeq) }, HeaderSeq, 0},
		{"seq not a number", func(r *kgo.Record) { setHeader(r, HeaderSeq, "seven") }, HeaderSeq, 0},
		{"seq zero", func(r *kgo.Record) { setHeader(r, HeaderSeq, "0") }, HeaderSeq, 0},
		{"seq negative", func(r *kgo.Record) { setHeader(r, HeaderSeq, "-3") }, HeaderSeq, 0},
		{"seq with a plus sign", func(r *kgo.Record) { setHeader(r, HeaderSeq, "+7") }, HeaderSeq, 0},
		{"seq with a leading zero", func(r *kgo.Record) { setHeader(r, HeaderSeq, "007") }, HeaderSeq, 0},
		{"seq with spaces", func(r *kgo.Record) { setHeader(r, HeaderSeq, " 7") }, HeaderSeq, 0},
		{"seq over int64", func(r *kgo.Record) { setHeader(r, HeaderSeq, "9999999999999999999") }, HeaderSeq, 0},
		{"event id with the reserved prefix", func(r *kgo.Record) { setHeader(r, HeaderEventID, "malformed:t:0:1") }, HeaderEventID, 0},
		{"two seqs", func(r *kgo.Record) {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: HeaderSeq, Value: []byte("9")})
		}, HeaderSeq, 0},
		{"no type", func(r *kgo.Record) { dropHeader(r, HeaderEventType) }, HeaderEventType, 0},
		{"not json", func(r *kgo.Record) { r.Value = []byte("{not json") }, "payload", 0},
		{"oversize", func(r *kgo.Record) { r.Value = []byte(`"` + strings.Repeat("a", 100) + `"`) }, "payload", 50},
		{"bad content type", func(r *kgo.Record) { setHeader(r, HeaderContentType, "///") }, HeaderContentType, 0},
		{"source with newline", func(r *kgo.Record) { setHeader(r, HeaderSource, "a\nb") }, HeaderSource, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := base()
			tc.mod(r)
			_, err := Decode(r, tc.max)
			var me *MalformedError
			if !errors.As(err, &me) {
				t.Fatalf("Decode = %v, want *MalformedError", err)
			}
			if me.Field != tc.field {
				t.Fatalf("field = %q (%v), want %q", me.Field, err, tc.field)
			}
			if me.Topic != "orders" || me.Partition != 2 || me.Offset != 17 {
				t.Fatalf("error does not locate the record: %v", err)
			}
		})
	}
}

func TestNonJSONContentTypeIsNotParsed(t *testing.T) {
	t.Parallel()
	e := validEnvelope()
	e.ContentType = "application/octet-stream"
	e.Payload = []byte{0xff, 0x00, 0x01}
	if _, err := Decode(e.Record("t"), 0); err != nil {
		t.Fatalf("binary payload with a binary content type: %v", err)
	}
	e.ContentType = "application/cloudevents+json"
	if _, err := Decode(e.Record("t"), 0); err == nil {
		t.Fatal("+json content type with a binary payload was accepted")
	}
}

func TestValidateRejectsReservedExtraHeader(t *testing.T) {
	t.Parallel()
	e := validEnvelope()
	e.Headers = map[string]string{"Seq": "1"}
	var fe *FieldError
	if err := e.Validate(0); !errors.As(err, &fe) || fe.Field != "headers" {
		t.Fatalf("Validate = %v, want a headers FieldError", err)
	}
}

// FuzzDecode: no record, however malformed, panics the decoder, and whatever
// it accepts survives a re-encode unchanged.
func FuzzDecode(f *testing.F) {
	e := validEnvelope()
	r := e.Record("t")
	f.Add(r.Key, r.Value, "event-id", "e1", "source", "s", "seq", "1", "event-type", "x")
	f.Add([]byte{}, []byte("{}"), "seq", "99999999999999999999", "source", "", "event-id", "", "", "")
	f.Fuzz(func(t *testing.T, key, value []byte, h1, v1, h2, v2, h3, v3, h4, v4 string) {
		rec := &kgo.Record{Key: key, Value: value, Headers: []kgo.RecordHeader{
			{Key: h1, Value: []byte(v1)}, {Key: h2, Value: []byte(v2)},
			{Key: h3, Value: []byte(v3)}, {Key: h4, Value: []byte(v4)},
		}}
		got, err := Decode(rec, 1<<16)
		if err != nil {
			var me *MalformedError
			if !errors.As(err, &me) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		again, err := Decode(got.Record("t"), 1<<16)
		if err != nil {
			t.Fatalf("re-encoded accepted envelope fails to decode: %v", err)
		}
		if again.EventID != got.EventID || again.Source != got.Source || again.Seq != got.Seq || again.EventType != got.EventType {
			t.Fatalf("re-encode changed the envelope: %+v vs %+v", got, again)
		}
	})
}

// Enqueue refuses a traceparent that is not W3C-shaped; a record carrying one
// still decodes, without it.
func TestTraceparentShape(t *testing.T) {
	t.Parallel()
	e := validEnvelope()
	e.Traceparent = "trace-me"
	var fe *FieldError
	if err := e.Validate(0); !errors.As(err, &fe) || fe.Field != HeaderTraceparent {
		t.Fatalf("Validate = %v, want a traceparent FieldError", err)
	}
	got, err := Decode(e.Record("t"), 0)
	if err != nil || got.Traceparent != "" || got.EventID != e.EventID {
		t.Fatalf("Decode = %+v, %v; want the event without its traceparent", got, err)
	}
}

// The producer header round-trips, is reserved (an extra header may not use
// it), and a record without it decodes as a legacy stream's (Producer "");
// a present but empty one, or two, make the record malformed.
func TestProducerHeader(t *testing.T) {
	t.Parallel()
	e := validEnvelope()
	e.Producer = "9f1c-db-a"
	rec := e.Record("orders")
	out, err := Decode(rec, 0)
	if err != nil || out.Producer != e.Producer || len(out.Headers) != 2 {
		t.Fatalf("Decode = %+v, %v; want producer %q and the two extra headers", out, err, e.Producer)
	}
	if !IsReserved("Producer") {
		t.Fatal("producer is not reserved")
	}
	legacy := validEnvelope()
	if out, err := Decode(legacy.Record("orders"), 0); err != nil || out.Producer != "" {
		t.Fatalf("Decode without the header = %+v, %v; want producer \"\"", out, err)
	}
	for name, hs := range map[string][]kgo.RecordHeader{
		"empty": {{Key: HeaderProducer, Value: nil}},
		"twice": {{Key: HeaderProducer, Value: []byte("a")}, {Key: "Producer", Value: []byte("b")}},
	} {
		r := legacy.Record("orders")
		r.Headers = append(r.Headers, hs...)
		var me *MalformedError
		if _, err := Decode(r, 0); !errors.As(err, &me) || me.Field != HeaderProducer {
			t.Fatalf("%s: Decode = %v, want a malformed producer", name, err)
		}
	}
	bad := validEnvelope()
	bad.Headers = map[string]string{"producer": "x"}
	if err := bad.Validate(0); err == nil {
		t.Fatal("Validate took an extra header named producer")
	}
}
