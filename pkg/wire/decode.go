package wire

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"strconv"
	"strings"
	"sync"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
)

// Decoder turns a record from any onceflow topic (any wire format, with or
// without CloudEvents) into the JSON view: a record in onceflow's envelope
// with a JSON value, which envelope.Decode reads. It is safe for concurrent
// use; schemas fetched from the registry are cached by id.
type Decoder struct {
	// Registry fetches the schemas of framed values (nil: a framed value is
	// malformed, with a reason saying a registry is needed).
	Registry *sr.Client
	// SeqFromOffset gives a CloudEvent without the sequence extension the
	// seq offset+1 (for a consumer that orders by arrival, which ignores
	// seq); without it such a record is malformed (a consumer ordering by
	// seq needs the sequence).
	SeqFromOffset bool

	mu     sync.Mutex
	codecs map[int]codec
}

// ViewError is a record that cannot be turned into the JSON view: the
// consumer dead-letters it as malformed.
func viewError(r *kgo.Record, field, reason string) error {
	return &envelope.MalformedError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Field: field, Reason: reason}
}

// View returns r in onceflow's envelope with a JSON value (r itself when it
// already is one). Errors are *envelope.MalformedError.
func (d *Decoder) View(ctx context.Context, r *kgo.Record) (*kgo.Record, error) {
	var ce, framed, structured bool
	var cv, ct string
	for _, h := range r.Headers {
		switch strings.ToLower(h.Key) {
		case HeaderCESpecVersion:
			ce = true
		case HeaderContractVersion:
			cv = string(h.Value)
		case HeaderWireFormat:
			f, err := ParseFormat(string(h.Value))
			if err != nil {
				return nil, viewError(r, HeaderWireFormat, err.Error())
			}
			framed = f.Registered()
		case envelope.HeaderContentType:
			ct = string(h.Value)
		}
	}
	if err := CheckContractVersion(cv); err != nil {
		return nil, viewError(r, HeaderContractVersion, err.Error())
	}
	if mt, _, err := mime.ParseMediaType(ct); err == nil {
		switch mt {
		case ContentTypeAvro, ContentTypeProtobuf, ContentTypeJSONSchema:
			framed = true
		case ContentTypeCloudEventsJSON:
			structured = true
		}
	}
	// A value from another producer's Confluent serializer may come with
	// neither header: JSON never starts with a NUL byte, the framing's magic.
	if !framed && !structured && d.Registry != nil && len(r.Value) > 5 && r.Value[0] == 0 {
		framed = true
	}
	if !ce && !framed && !structured {
		return r, nil
	}
	out := *r
	out.Headers = make([]kgo.RecordHeader, 0, len(r.Headers))
	for _, h := range r.Headers {
		if strings.ToLower(h.Key) != HeaderWireFormat {
			out.Headers = append(out.Headers, h)
		}
	}
	if structured {
		if err := d.fromStructured(&out); err != nil {
			return nil, err
		}
	} else if ce {
		if err := d.fromBinaryCE(&out); err != nil {
			return nil, err
		}
	}
	if framed && !structured {
		v, err := d.unframe(ctx, r)
		if err != nil {
			return nil, err
		}
		out.Value = v
		setHeader(&out, envelope.HeaderContentType, envelope.ContentTypeJSON)
	}
	return &out, nil
}

// unframe decodes a Confluent-framed value into JSON with its schema.
func (d *Decoder) unframe(ctx context.Context, r *kgo.Record) ([]byte, error) {
	var h sr.ConfluentHeader
	id, rest, err := h.DecodeID(r.Value)
	if err != nil {
		return nil, viewError(r, "value", fmt.Sprintf("not in the schema registry's framing: %v", err))
	}
	c, err := d.codec(ctx, id)
	if err != nil {
		return nil, viewError(r, "value", err.Error())
	}
	if _, ok := c.(*protoCodec); ok {
		idx, rest2, err := h.DecodeIndex(rest, 64)
		if err != nil {
			return nil, viewError(r, "value", fmt.Sprintf("protobuf message index: %v", err))
		}
		if c, err = d.protoAt(ctx, id, idx); err != nil {
			return nil, viewError(r, "value", err.Error())
		}
		rest = rest2
	}
	v, err := c.decode(rest)
	if err != nil {
		return nil, viewError(r, "value", fmt.Sprintf("schema id %d: %v", id, err))
	}
	return v, nil
}

// codec is the codec of schema id (the first message for Protobuf).
func (d *Decoder) codec(ctx context.Context, id int) (codec, error) {
	d.mu.Lock()
	c, ok := d.codecs[id]
	d.mu.Unlock()
	if ok {
		return c, nil
	}
	s, err := d.schema(ctx, id)
	if err != nil {
		return nil, err
	}
	if c, err = compile(formatOf(s.Type), s.Schema, ""); err != nil {
		return nil, fmt.Errorf("schema id %d: %w", id, err)
	}
	d.mu.Lock()
	if d.codecs == nil {
		d.codecs = map[int]codec{}
	}
	d.codecs[id] = c
	d.mu.Unlock()
	return c, nil
}

func (d *Decoder) schema(ctx context.Context, id int) (sr.Schema, error) {
	if d.Registry == nil {
		return sr.Schema{}, fmt.Errorf("framed with schema id %d, but this consumer has no schema registry configured", id)
	}
	s, err := d.Registry.SchemaByID(ctx, id)
	if err != nil {
		return sr.Schema{}, fmt.Errorf("fetch schema id %d: %w", id, err)
	}
	if len(s.References) > 0 {
		return sr.Schema{}, fmt.Errorf("schema id %d has references, which onceflow does not resolve", id)
	}
	return s, nil
}

// protoAt is the codec of the message at idx in Protobuf schema id.
func (d *Decoder) protoAt(ctx context.Context, id int, idx []int) (codec, error) {
	c, err := d.codec(ctx, id)
	if err != nil {
		return nil, err
	}
	pc := c.(*protoCodec)
	if len(idx) == 1 && idx[0] == 0 {
		return pc, nil
	}
	md := pc.md.ParentFile().Messages()
	if len(idx) == 0 || idx[0] >= md.Len() {
		return nil, fmt.Errorf("schema id %d has no message at index %v", id, idx)
	}
	m := md.Get(idx[0])
	for _, i := range idx[1:] {
		if i >= m.Messages().Len() {
			return nil, fmt.Errorf("schema id %d has no message at index %v", id, idx)
		}
		m = m.Messages().Get(i)
	}
	return &protoCodec{md: m, idx: idx}, nil
}

// fromBinaryCE maps a binary-mode CloudEvent's attributes to the envelope's
// headers: ce_id -> event-id, ce_source -> source, ce_type -> event-type,
// ce_sequence -> seq. An event written by another producer (no producer
// header) gets the event id "ce:<len(source)>:<source>:<id>", so that the
// inbox dedups by source and id as CloudEvents define identity.
func (d *Decoder) fromBinaryCE(r *kgo.Record) error {
	attrs := map[string]string{}
	var producer bool
	hs := r.Headers[:0:0]
	for _, h := range r.Headers {
		k := strings.ToLower(h.Key)
		switch {
		case strings.HasPrefix(k, HeaderCEPrefix):
			if _, dup := attrs[k]; dup {
				return viewError(r, h.Key, "appears more than once")
			}
			attrs[k] = string(h.Value)
			continue
		case k == envelope.HeaderProducer:
			producer = true
		case k == envelope.HeaderEventID || k == envelope.HeaderSource || k == envelope.HeaderSeq || k == envelope.HeaderEventType:
			continue // the CloudEvent's attributes govern
		}
		hs = append(hs, h)
	}
	if v := attrs[HeaderCESpecVersion]; !strings.HasPrefix(v, "1.") {
		return viewError(r, HeaderCESpecVersion, fmt.Sprintf("%q is not a CloudEvents 1.x version", v))
	}
	id, source, typ := attrs[HeaderCEID], attrs[HeaderCESource], attrs[HeaderCEType]
	for k, v := range map[string]string{HeaderCEID: id, HeaderCESource: source, HeaderCEType: typ} {
		if v == "" {
			return viewError(r, k, "is missing or empty (a required CloudEvents attribute)")
		}
	}
	seq, err := d.seq(r, attrs[HeaderCESequence])
	if err != nil {
		return err
	}
	eventID := id
	if !producer {
		eventID = ForeignEventID(source, id)
	}
	hs = append(hs,
		kgo.RecordHeader{Key: envelope.HeaderEventID, Value: []byte(eventID)},
		kgo.RecordHeader{Key: envelope.HeaderSource, Value: []byte(source)},
		kgo.RecordHeader{Key: envelope.HeaderSeq, Value: strconv.AppendInt(nil, seq, 10)},
		kgo.RecordHeader{Key: envelope.HeaderEventType, Value: []byte(typ)},
	)
	// Other attributes (ce_time, ce_subject, extensions) stay readable as
	// extra headers.
	for k, v := range attrs {
		switch k {
		case HeaderCESpecVersion, HeaderCEID, HeaderCESource, HeaderCEType, HeaderCESequence:
		default:
			hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	r.Headers = hs
	return nil
}

// ForeignEventID is the event id a consumer gives a CloudEvent from a
// producer other than a onceflow relay: its source and id, unambiguously.
func ForeignEventID(source, id string) string {
	return "ce:" + strconv.Itoa(len(source)) + ":" + source + ":" + id
}

func (d *Decoder) seq(r *kgo.Record, s string) (int64, error) {
	if s == "" {
		if d.SeqFromOffset {
			return r.Offset + 1, nil
		}
		return 0, viewError(r, HeaderCESequence, "is missing: a consumer ordering by seq needs the CloudEvents sequence extension (order such a topic by arrival)")
	}
	n, err := parseSequence(s)
	if err != nil {
		return 0, viewError(r, HeaderCESequence, err.Error())
	}
	return n, nil
}

// fromStructured reads a structured-mode CloudEvent (JSON event format):
// its attributes become headers and its data the value.
func (d *Decoder) fromStructured(r *kgo.Record) error {
	var ev struct {
		structuredEvent
		DataBase64 string `json:"data_base64"`
	}
	if err := json.Unmarshal(r.Value, &ev); err != nil {
		return viewError(r, "value", fmt.Sprintf("not a CloudEvents JSON event: %v", err))
	}
	if ev.DataBase64 != "" {
		return viewError(r, "value", "data_base64 (binary data) is not a JSON payload")
	}
	var hs []kgo.RecordHeader
	for _, h := range r.Headers {
		k := strings.ToLower(h.Key)
		if strings.HasPrefix(k, HeaderCEPrefix) || k == envelope.HeaderContentType ||
			(k == envelope.HeaderTraceparent && ev.Traceparent != "") {
			continue
		}
		hs = append(hs, h)
	}
	ct := ev.DataContentType
	if ct == "" {
		ct = envelope.ContentTypeJSON
	}
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderCESpecVersion, Value: []byte(ev.SpecVersion)},
		kgo.RecordHeader{Key: HeaderCEID, Value: []byte(ev.ID)},
		kgo.RecordHeader{Key: HeaderCESource, Value: []byte(ev.Source)},
		kgo.RecordHeader{Key: HeaderCEType, Value: []byte(ev.Type)},
		kgo.RecordHeader{Key: envelope.HeaderContentType, Value: []byte(ct)},
	)
	if ev.Sequence != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderCESequence, Value: []byte(ev.Sequence)})
	}
	if ev.Time != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderCETime, Value: []byte(ev.Time)})
	}
	if ev.Traceparent != "" {
		hs = append(hs, kgo.RecordHeader{Key: envelope.HeaderTraceparent, Value: []byte(ev.Traceparent)})
	}
	r.Headers = hs
	if len(ev.Data) == 0 {
		r.Value = []byte("null")
	} else {
		r.Value = ev.Data
	}
	return d.fromBinaryCE(r)
}
