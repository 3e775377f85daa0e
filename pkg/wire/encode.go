package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
)

// PayloadError means an event's payload does not fit its topic's schema. The
// relay sets such a row aside with this reason; other rows keep flowing.
type PayloadError struct {
	Topic   string
	Subject string
	Err     error
}

func (e *PayloadError) Error() string {
	return fmt.Sprintf("payload does not fit the schema of topic %q (subject %q): %v", e.Topic, e.Subject, e.Err)
}

func (e *PayloadError) Unwrap() error { return e.Err }

// ErrNotRegistered means a topic's schema is not in the registry under its
// subject: `relay topics apply` registers it.
var ErrNotRegistered = errors.New("schema is not registered (run relay topics apply)")

// Encoder lays events out on records in each topic's wire format. A nil
// *Encoder writes every topic as json with onceflow's envelope headers.
type Encoder struct {
	topics map[string]*topicCodec
}

type topicCodec struct {
	tf    TopicFormat
	id    int // schema id (registered formats)
	codec codec
	// The header values every record of the topic carries, made once:
	// records share them (read-only), so building a record copies none.
	contentType, wireFormat []byte
}

// newTopicCodec is tf's codec state, without its schema id.
func newTopicCodec(tf TopicFormat) *topicCodec {
	return &topicCodec{tf: tf, contentType: []byte(tf.Format.ContentType()), wireFormat: []byte(tf.Format)}
}

// contractVersionValue is the contract-version header's value, shared by
// every record.
var contractVersionValue = []byte(ContractVersion)

// NewEncoder prepares an encoder for the topics in formats (topic name ->
// format; topics not named are json). For a registered format it looks the
// schema up in the registry under its subject to learn its id: the schema
// must have been registered (relay topics apply), else the error wraps
// ErrNotRegistered. cl may be nil when no topic needs a registry.
func NewEncoder(ctx context.Context, cl *sr.Client, formats map[string]TopicFormat) (*Encoder, error) {
	e := &Encoder{topics: map[string]*topicCodec{}}
	for topic, tf := range formats {
		if err := tf.Validate(); err != nil {
			return nil, fmt.Errorf("topic %q: %w", topic, err)
		}
		tc := newTopicCodec(tf)
		if tf.Format.Registered() {
			if cl == nil {
				return nil, fmt.Errorf("topic %q is %s: a schema registry URL is required", topic, tf.Format)
			}
			c, err := compile(tf.Format, tf.Schema, tf.Message)
			if err != nil {
				return nil, fmt.Errorf("topic %q: %w", topic, err)
			}
			tc.codec = c
			subject := tf.SubjectFor(topic)
			ss, err := cl.LookupSchema(ctx, subject, sr.Schema{Schema: tf.Schema, Type: schemaType(tf.Format)})
			if err != nil {
				var re *sr.ResponseError
				if errors.As(err, &re) && re.StatusCode == 404 {
					return nil, fmt.Errorf("topic %q, subject %q: %w", topic, subject, ErrNotRegistered)
				}
				return nil, fmt.Errorf("topic %q: look up subject %q: %w", topic, subject, err)
			}
			tc.id = ss.ID
		}
		e.topics[topic] = tc
	}
	return e, nil
}

// Format is topic's wire format (json when the encoder does not name it).
func (e *Encoder) Format(topic string) TopicFormat {
	if e != nil {
		if tc, ok := e.topics[topic]; ok {
			return tc.tf
		}
	}
	return TopicFormat{Format: FormatJSON}
}

// Check reports whether payload fits topic's schema (nil for json topics):
// an enqueue path that knows the topic can refuse a payload early.
func (e *Encoder) Check(topic string, payload []byte) error {
	if e == nil {
		return nil
	}
	tc, ok := e.topics[topic]
	if !ok || tc.codec == nil {
		return nil
	}
	if _, err := tc.codec.encode(payload); err != nil {
		return &PayloadError{Topic: topic, Subject: tc.tf.SubjectFor(topic), Err: err}
	}
	return nil
}

// Record lays env out on a record for topic in the topic's wire format. It
// is envelope.Envelope.Record plus: the contract-version header; for a
// registered format, the value encoded and framed with the schema id (a
// payload that does not fit gives a *PayloadError); for a CloudEvents topic,
// the attributes as ce_* headers (binary) or the whole event in the value
// (structured).
func (e *Encoder) Record(env *envelope.Envelope, topic string) (*kgo.Record, error) {
	var tc *topicCodec
	if e != nil {
		tc = e.topics[topic]
	}
	if tc == nil {
		tc = jsonTopic
	}
	tf := tc.tf
	rec := env.Record(topic)
	if tf.Format.Registered() {
		data, err := tc.codec.encode(env.Payload)
		if err != nil {
			return nil, &PayloadError{Topic: topic, Subject: tf.SubjectFor(topic), Err: err}
		}
		var h sr.ConfluentHeader
		framed, err := h.AppendEncode(make([]byte, 0, 6+len(data)), tc.id, tc.codec.index())
		if err != nil {
			return nil, fmt.Errorf("frame record for topic %q: %w", topic, err)
		}
		rec.Value = append(framed, data...)
		setHeaderValue(rec, envelope.HeaderContentType, tc.contentType)
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderWireFormat, Value: tc.wireFormat})
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderContractVersion, Value: contractVersionValue})
	switch tf.CloudEvents {
	case CloudEventsBinary:
		toBinaryCE(rec, env)
	case CloudEventsStructured:
		if err := toStructuredCE(rec, env); err != nil {
			return nil, fmt.Errorf("cloudevent for topic %q: %w", topic, err)
		}
	}
	return rec, nil
}

func setHeader(r *kgo.Record, key, value string) { setHeaderValue(r, key, []byte(value)) }

func setHeaderValue(r *kgo.Record, key string, value []byte) {
	for i := range r.Headers {
		if r.Headers[i].Key == key {
			r.Headers[i].Value = value
			return
		}
	}
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: key, Value: value})
}

// jsonTopic is the state of a topic the encoder does not name.
var jsonTopic = newTopicCodec(TopicFormat{Format: FormatJSON})

// CloudEvents attribute headers (Kafka protocol binding, binary mode).
const (
	HeaderCEPrefix      = "ce_"
	HeaderCESpecVersion = "ce_specversion"
	HeaderCEID          = "ce_id"
	HeaderCESource      = "ce_source"
	HeaderCEType        = "ce_type"
	HeaderCETime        = "ce_time"
	HeaderCESequence    = "ce_sequence"
	// CESpecVersion is the CloudEvents version written.
	CESpecVersion = "1.0"
	// ContentTypeCloudEventsJSON is the content type of a structured-mode
	// record.
	ContentTypeCloudEventsJSON = "application/cloudevents+json"
)

// FormatSequence writes seq as the CloudEvents sequence extension: a string
// whose lexicographic order is the numeric order (19 digits, zero-padded).
func FormatSequence(seq int64) string {
	return fmt.Sprintf("%019d", seq)
}

// ceTime is the event time written: the record's timestamp, else now.
func ceTime(env *envelope.Envelope) string {
	t := env.Timestamp
	if t.IsZero() {
		t = time.Now()
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// toBinaryCE replaces the envelope's identifying headers (event-id, source,
// seq, event-type) by their CloudEvents attributes; content-type (the
// datacontenttype), traceparent, producer and the extra headers stay.
func toBinaryCE(rec *kgo.Record, env *envelope.Envelope) {
	hs := make([]kgo.RecordHeader, 0, len(rec.Headers)+2)
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderCESpecVersion, Value: []byte(CESpecVersion)},
		kgo.RecordHeader{Key: HeaderCEID, Value: []byte(env.EventID)},
		kgo.RecordHeader{Key: HeaderCESource, Value: []byte(env.Source)},
		kgo.RecordHeader{Key: HeaderCEType, Value: []byte(env.EventType)},
		kgo.RecordHeader{Key: HeaderCETime, Value: []byte(ceTime(env))},
		kgo.RecordHeader{Key: HeaderCESequence, Value: []byte(FormatSequence(env.Seq))},
	)
	for _, h := range rec.Headers {
		switch h.Key {
		case envelope.HeaderEventID, envelope.HeaderSource, envelope.HeaderSeq, envelope.HeaderEventType:
			continue
		}
		hs = append(hs, h)
	}
	rec.Headers = hs
}

// structuredEvent is a CloudEvent in the JSON event format.
type structuredEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Time            string          `json:"time,omitempty"`
	Sequence        string          `json:"sequence,omitempty"`
	DataContentType string          `json:"datacontenttype,omitempty"`
	Traceparent     string          `json:"traceparent,omitempty"`
	Data            json.RawMessage `json:"data,omitempty"`
}

func toStructuredCE(rec *kgo.Record, env *envelope.Envelope) error {
	ct := env.ContentType
	if ct == "" {
		ct = envelope.ContentTypeJSON
	}
	if !envelope.IsJSON(ct) {
		return fmt.Errorf("structured mode needs a JSON payload, content type is %s", ct)
	}
	v, err := json.Marshal(structuredEvent{
		SpecVersion: CESpecVersion, ID: env.EventID, Source: env.Source, Type: env.EventType,
		Time: ceTime(env), Sequence: FormatSequence(env.Seq), DataContentType: ct,
		Traceparent: env.Traceparent, Data: env.Payload,
	})
	if err != nil {
		return err
	}
	rec.Value = v
	toBinaryCE(rec, env) // the same headers: readers that ignore the value's attributes still route
	setHeader(rec, envelope.HeaderContentType, ContentTypeCloudEventsJSON)
	return nil
}

// parseSequence reads a CloudEvents sequence as onceflow's seq: decimal
// digits (leading zeros allowed), 1..MaxInt64.
func parseSequence(s string) (int64, error) {
	if s == "" || len(s) > 64 {
		return 0, fmt.Errorf("%q is not a decimal sequence", s)
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a decimal sequence (onceflow orders by numeric sequences)", s)
		}
	}
	n, err := strconv.ParseInt(trimZeros(s), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a sequence from 1 to 9223372036854775807", s)
	}
	return n, nil
}

func trimZeros(s string) string {
	for len(s) > 1 && s[0] == '0' {
		s = s[1:]
	}
	return s
}
