// Package spec is the envelope's rules without Kafka: the header names,
// the limits, the checks of each field and the payload schemas. Package
// envelope lays the envelope out on Kafka records with them; producers that
// only enqueue (package outbox) check their events with them and link no
// Kafka client.
package spec

import (
	"encoding/json"
	"fmt"
	"mime"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

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
	// it to its database's identity (the relay admin's Identity.ID). With the topic
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

// IsTraceparent reports whether s has the W3C Trace Context shape of a
// traceparent.
func IsTraceparent(s string) bool { return traceparentRE.MatchString(s) }

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

// Fields are one event's envelope fields, Kafka aside (envelope.Envelope
// has the same fields).
type Fields struct {
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
func (e *Fields) RecordKey() []byte {
	if len(e.Key) > 0 {
		return e.Key
	}
	return []byte(e.Source)
}

// Validate checks the fields the contract requires. maxPayload <= 0 means
// DefaultMaxPayloadBytes.
func (e *Fields) Validate(maxPayload int) error {
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// FieldError says which envelope field is invalid and why.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

// PayloadError is a payload that violates the JSON Schema declared for its
// event type. Violation is the validator's description (instance locations
// and what failed).
type PayloadError struct {
	EventType string
	Violation string
}

func (e *PayloadError) Error() string {
	return fmt.Sprintf("payload of event type %s violates its schema: %s", e.EventType, e.Violation)
}
