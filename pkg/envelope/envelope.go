// Package envelope is onceflow's Kafka topic contract in code: how an event
// is laid out on a record (key, headers, value) and how a record is checked
// and decoded back. The relay encodes with it and the consumer decodes with
// it, so header names and parsing rules exist once. docs/contract.md is the
// same contract in words for other teams.
package envelope

import (
	"encoding/json"
	"fmt"
	"mime"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"
)

// Header names of the envelope.
const (
	HeaderEventID     = "event-id"
	HeaderSource      = "source"
	HeaderSeq         = "seq"
	HeaderEventType   = "event-type"
	HeaderContentType = "content-type"
	HeaderTraceparent = "traceparent"
	// HeaderProducer names the producer that wrote the event: the relay sets
	// it to its database's identity (pkg/outbox Identity.ID). With the topic
	// and the source it identifies the event's stream, the unit a consumer
	// orders and dedups by seq. A record without it belongs to a legacy
	// stream (one per source, across topics: what relays before the header
	// wrote).
	HeaderProducer = "producer"
)

// HeaderTracestate carries the W3C Trace Context tracestate that belongs to
// the traceparent. It is an ordinary (not reserved) application header: a
// producer refuses one that is not W3C-shaped (CheckTracestate) or comes
// without a traceparent; a consumer ignores a malformed one.
const HeaderTracestate = "tracestate"

// MaxTracestateBytes bounds a tracestate (W3C asks propagators to pass on at
// least 512 characters; onceflow passes on at most that).
const MaxTracestateBytes = 512

// ContentTypeJSON is the default content type of a payload.
const ContentTypeJSON = "application/json"

// DefaultMaxPayloadBytes bounds a payload unless configured otherwise.
const DefaultMaxPayloadBytes = 1 << 20

// Limits on the identifying fields. They keep keys index-friendly and make a
// record with garbage headers fail loudly instead of bloating the inbox.
const (
	MaxEventIDBytes   = 512
	MaxSourceBytes    = 512
	MaxEventTypeBytes = 256
	MaxProducerBytes  = 256
	MaxHeaderBytes    = 8 << 10
)

// ReservedEventIDPrefix starts no event id: a consumer keys a record that
// breaks the envelope "malformed:<topic>:<topic id>:<partition>:<offset>"
// (or, written before topic ids, "malformed:<topic>:<partition>:<offset>"), and a valid
// event id must never collide with such a key.
const ReservedEventIDPrefix = "malformed:"

// traceparentRE is the W3C Trace Context shape of a traceparent (any
// version; later versions may append fields).
var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[0-9a-zA-Z._-]*)?$`)

var reserved = map[string]bool{
	HeaderEventID: true, HeaderSource: true, HeaderSeq: true,
	HeaderEventType: true, HeaderContentType: true, HeaderTraceparent: true,
	HeaderProducer: true,
}

// CheckTracestate validates a W3C tracestate: at most 32 comma-separated
// key=value list-members with distinct keys, in the W3C character sets, and
// at most MaxTracestateBytes bytes.
func CheckTracestate(ts string) error {
	if len(ts) > MaxTracestateBytes {
		return &FieldError{Field: HeaderTracestate, Reason: fmt.Sprintf("%d bytes is over the limit of %d", len(ts), MaxTracestateBytes)}
	}
	if _, err := trace.ParseTraceState(ts); err != nil {
		return &FieldError{Field: HeaderTracestate, Reason: fmt.Sprintf("%q is not a W3C tracestate: %v", truncate(ts, 80), err)}
	}
	return nil
}

// IsReserved reports whether name is one of the envelope's own headers, which
// an event's extra headers may not use.
func IsReserved(name string) bool { return reserved[strings.ToLower(name)] }

// Envelope is one event as it travels on a topic.
type Envelope struct {
	EventID     string
	Source      string
	Seq         int64
	EventType   string
	ContentType string
	Traceparent string
	// Producer is the producer's identity ("" for a legacy stream's record:
	// no header).
	Producer string
	// Key is the record key; empty means the source.
	Key []byte
	// Headers are extra application headers (never the reserved names).
	Headers map[string]string
	Payload []byte
	// Timestamp of the record (the time the relay produced it); zero on encode
	// lets the client set it.
	Timestamp time.Time
}

// RecordKey is the key the record carries: Key, or the source when Key is empty.
func (e *Envelope) RecordKey() []byte {
	if len(e.Key) > 0 {
		return e.Key
	}
	return []byte(e.Source)
}

// Validate checks the fields the contract requires. maxPayload <= 0 means
// DefaultMaxPayloadBytes.
func (e *Envelope) Validate(maxPayload int) error {
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayloadBytes
	}
	if err := checkText(HeaderEventID, e.EventID, MaxEventIDBytes); err != nil {
		return err
	}
	if strings.HasPrefix(e.EventID, ReservedEventIDPrefix) {
		return &FieldError{Field: HeaderEventID, Reason: fmt.Sprintf("must not start with %q (reserved for the keys of records that break the envelope)", ReservedEventIDPrefix)}
	}
	if err := checkText(HeaderSource, e.Source, MaxSourceBytes); err != nil {
		return err
	}
	if err := checkText(HeaderEventType, e.EventType, MaxEventTypeBytes); err != nil {
		return err
	}
	if e.Seq <= 0 {
		return &FieldError{Field: HeaderSeq, Reason: fmt.Sprintf("must be a positive integer, got %d", e.Seq)}
	}
	ct := e.ContentType
	if ct == "" {
		ct = ContentTypeJSON
	}
	if _, _, err := mime.ParseMediaType(ct); err != nil {
		return &FieldError{Field: HeaderContentType, Reason: fmt.Sprintf("%q is not a media type: %v", ct, err)}
	}
	if len(e.Payload) > maxPayload {
		return &FieldError{Field: "payload", Reason: fmt.Sprintf("%d bytes is over the limit of %d", len(e.Payload), maxPayload)}
	}
	if IsJSON(ct) && !json.Valid(e.Payload) {
		return &FieldError{Field: "payload", Reason: fmt.Sprintf("content type is %s but the payload is not valid JSON", ct)}
	}
	if e.Traceparent != "" && !traceparentRE.MatchString(e.Traceparent) {
		return &FieldError{Field: HeaderTraceparent, Reason: fmt.Sprintf("%q is not a W3C traceparent", truncate(e.Traceparent, 80))}
	}
	if e.Producer != "" {
		if err := checkText(HeaderProducer, e.Producer, MaxProducerBytes); err != nil {
			return err
		}
	}
	for k, v := range e.Headers {
		if err := CheckHeader(k, v); err != nil {
			return err
		}
	}
	return nil
}

// CheckHeader validates one extra header.
func CheckHeader(name, value string) error {
	switch {
	case name == "":
		return &FieldError{Field: "headers", Reason: "a header name is empty"}
	case IsReserved(name):
		return &FieldError{Field: "headers", Reason: fmt.Sprintf("%q is reserved by the envelope", name)}
	case !utf8.ValidString(name) || !utf8.ValidString(value):
		return &FieldError{Field: "headers", Reason: fmt.Sprintf("header %q is not valid UTF-8", name)}
	case len(name)+len(value) > MaxHeaderBytes:
		return &FieldError{Field: "headers", Reason: fmt.Sprintf("header %q is over %d bytes", name, MaxHeaderBytes)}
	}
	return nil
}

// IsJSON reports whether a content type declares JSON (application/json or a
// +json suffix type).
func IsJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == ContentTypeJSON || strings.HasSuffix(mt, "+json")
}

func checkText(field, v string, limit int) error {
	switch {
	case v == "":
		return &FieldError{Field: field, Reason: "is missing or empty"}
	case len(v) > limit:
		return &FieldError{Field: field, Reason: fmt.Sprintf("%d bytes is over the limit of %d", len(v), limit)}
	case !utf8.ValidString(v):
		return &FieldError{Field: field, Reason: "is not valid UTF-8"}
	case strings.ContainsAny(v, "\x00\n\r"):
		return &FieldError{Field: field, Reason: "contains a control character"}
	}
	return nil
}

// Record lays the envelope out on a Kafka record for topic.
func (e *Envelope) Record(topic string) *kgo.Record {
	ct := e.ContentType
	if ct == "" {
		ct = ContentTypeJSON
	}
	hs := make([]kgo.RecordHeader, 0, 7+len(e.Headers))
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderEventID, Value: []byte(e.EventID)},
		kgo.RecordHeader{Key: HeaderSource, Value: []byte(e.Source)},
		kgo.RecordHeader{Key: HeaderSeq, Value: strconv.AppendInt(nil, e.Seq, 10)},
		kgo.RecordHeader{Key: HeaderEventType, Value: []byte(e.EventType)},
		kgo.RecordHeader{Key: HeaderContentType, Value: []byte(ct)},
	)
	if e.Traceparent != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderTraceparent, Value: []byte(e.Traceparent)})
	}
	if e.Producer != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderProducer, Value: []byte(e.Producer)})
	}
	for _, k := range sortedKeys(e.Headers) {
		hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(e.Headers[k])})
	}
	return &kgo.Record{
		Topic:     topic,
		Key:       e.RecordKey(),
		Value:     e.Payload,
		Headers:   hs,
		Timestamp: e.Timestamp,
	}
}

// Decode reads and validates an envelope from a record. A malformed record
// gives a *MalformedError naming the field; the caller dead-letters it.
// maxPayload <= 0 means DefaultMaxPayloadBytes.
func Decode(r *kgo.Record, maxPayload int) (Envelope, error) {
	e := Envelope{Key: r.Key, Payload: r.Value, Timestamp: r.Timestamp}
	seen := map[string]bool{}
	var seqText string
	for _, h := range r.Headers {
		name := strings.ToLower(h.Key)
		if reserved[name] {
			if seen[name] {
				return e, malformed(r, name, "appears more than once")
			}
			seen[name] = true
		}
		switch name {
		case HeaderEventID:
			e.EventID = string(h.Value)
		case HeaderSource:
			e.Source = string(h.Value)
		case HeaderSeq:
			seqText = string(h.Value)
		case HeaderEventType:
			e.EventType = string(h.Value)
		case HeaderContentType:
			e.ContentType = string(h.Value)
		case HeaderTraceparent:
			e.Traceparent = string(h.Value)
		case HeaderProducer:
			e.Producer = string(h.Value)
		default:
			if e.Headers == nil {
				e.Headers = map[string]string{}
			}
			e.Headers[h.Key] = string(h.Value)
		}
	}
	if seen[HeaderProducer] && e.Producer == "" {
		// An empty producer header is not "no producer": a legacy stream
		// is the absence of the header, never a value a relay writes.
		return e, malformed(r, HeaderProducer, "is present but empty")
	}
	if !seen[HeaderSeq] {
		return e, malformed(r, HeaderSeq, "is missing or empty")
	}
	if !canonicalSeq(seqText) {
		return e, malformed(r, HeaderSeq, fmt.Sprintf("%q is not a canonical decimal integer (1 to 19 digits, no sign, no leading zero)", truncate(seqText, 40)))
	}
	seq, err := strconv.ParseInt(seqText, 10, 64)
	if err != nil {
		return e, malformed(r, HeaderSeq, fmt.Sprintf("%q is not an int64", truncate(seqText, 40)))
	}
	e.Seq = seq
	if e.ContentType == "" {
		e.ContentType = ContentTypeJSON
	}
	// A traceparent that is not W3C-shaped loses the trace link, not the
	// event: it is dropped rather than dead-lettering the record.
	if e.Traceparent != "" && !traceparentRE.MatchString(e.Traceparent) {
		e.Traceparent = ""
	}
	if err := e.Validate(maxPayload); err != nil {
		fe := err.(*FieldError)
		return e, &MalformedError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Field: fe.Field, Reason: fe.Reason}
	}
	return e, nil
}

// canonicalSeq reports whether s is a seq as the contract writes it:
// ^[1-9][0-9]{0,18}$ (strconv.ParseInt alone also takes "+7" and "007").
func canonicalSeq(s string) bool {
	if len(s) == 0 || len(s) > 19 || s[0] < '1' || s[0] > '9' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func malformed(r *kgo.Record, field, reason string) error {
	return &MalformedError{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Field: field, Reason: reason}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func sortedKeys(m map[string]string) []string {
	if len(m) == 0 {
		return nil
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	for i := 1; i < len(ks); i++ { // tiny maps: insertion sort
		for j := i; j > 0 && ks[j] < ks[j-1]; j-- {
			ks[j], ks[j-1] = ks[j-1], ks[j]
		}
	}
	return ks
}
