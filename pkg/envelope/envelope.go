// Package envelope is onceflow's Kafka topic contract in code: how an event
// is laid out on a record (key, headers, value) and how a record is checked
// and decoded back. The relay encodes with it and the consumer decodes with
// it, so header names and parsing rules exist once. docs/contract.md is the
// same contract in words for other teams.
package envelope

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/envelope/spec"
)

// The contract's rules live in package spec, which links no Kafka client;
// this package re-exports them beside the Kafka layout (Record, Decode).

// Header names of the envelope.
const (
	HeaderEventID     = spec.HeaderEventID
	HeaderSource      = spec.HeaderSource
	HeaderSeq         = spec.HeaderSeq
	HeaderEventType   = spec.HeaderEventType
	HeaderContentType = spec.HeaderContentType
	HeaderTraceparent = spec.HeaderTraceparent
	// HeaderProducer names the producer that wrote the event: the relay sets
	// it to its database's identity (the relay admin's Identity.ID). With
	// the topic and the source it identifies the event's stream, the unit a
	// consumer orders and dedups by seq. A record without it belongs to a
	// legacy stream (one per source, across topics: what relays before the
	// header wrote).
	HeaderProducer = spec.HeaderProducer
)

// HeaderTracestate carries the W3C Trace Context tracestate that belongs to
// the traceparent. It is an ordinary (not reserved) application header: a
// producer refuses one that is not W3C-shaped (CheckTracestate) or comes
// without a traceparent; a consumer ignores a malformed one.
const HeaderTracestate = spec.HeaderTracestate

// MaxTracestateBytes bounds a tracestate (W3C asks propagators to pass on at
// least 512 characters; onceflow passes on at most that).
const MaxTracestateBytes = spec.MaxTracestateBytes

// ContentTypeJSON is the default content type of a payload.
const ContentTypeJSON = spec.ContentTypeJSON

// DefaultMaxPayloadBytes bounds a payload unless configured otherwise.
const DefaultMaxPayloadBytes = spec.DefaultMaxPayloadBytes

// Limits on the identifying fields. They keep keys index-friendly and make a
// record with garbage headers fail loudly instead of bloating the inbox.
const (
	MaxEventIDBytes   = spec.MaxEventIDBytes
	MaxSourceBytes    = spec.MaxSourceBytes
	MaxEventTypeBytes = spec.MaxEventTypeBytes
	MaxProducerBytes  = spec.MaxProducerBytes
	MaxHeaderBytes    = spec.MaxHeaderBytes
)

// ReservedEventIDPrefix starts no event id: a consumer keys a record that
// breaks the envelope "malformed:<topic>:<topic id>:<partition>:<offset>"
// (or, written before topic ids, "malformed:<topic>:<partition>:<offset>"), and a valid
// event id must never collide with such a key.
const ReservedEventIDPrefix = spec.ReservedEventIDPrefix

// CheckTracestate validates a W3C tracestate: at most 32 comma-separated
// key=value list-members with distinct keys, in the W3C character sets, and
// at most MaxTracestateBytes bytes.
func CheckTracestate(ts string) error { return spec.CheckTracestate(ts) }

// IsReserved reports whether name is one of the envelope's own headers, which
// an event's extra headers may not use.
func IsReserved(name string) bool { return spec.IsReserved(name) }

// CheckHeader validates one extra header.
func CheckHeader(name, value string) error { return spec.CheckHeader(name, value) }

// IsJSON reports whether a content type declares JSON (application/json or a
// +json suffix type).
func IsJSON(contentType string) bool { return spec.IsJSON(contentType) }

// Envelope is one event as it travels on a topic. Its fields are
// spec.Fields' (the conversion in Validate keeps the two alike).
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
func (e *Envelope) RecordKey() []byte { return (*spec.Fields)(e).RecordKey() }

// Validate checks the fields the contract requires. maxPayload <= 0 means
// DefaultMaxPayloadBytes.
func (e *Envelope) Validate(maxPayload int) error { return (*spec.Fields)(e).Validate(maxPayload) }

// Record lays the envelope out on a Kafka record for topic. The header
// values share one allocation (each capped, so an append to one copies it
// rather than overwriting the next), and the header slice has room for the
// two headers a wire encoder adds (pkg/wire): the relay builds a record per
// event.
func (e *Envelope) Record(topic string) *kgo.Record {
	ct := e.ContentType
	if ct == "" {
		ct = ContentTypeJSON
	}
	n := len(e.EventID) + len(e.Source) + 20 + len(e.EventType) + len(ct) + len(e.Traceparent) + len(e.Producer)
	for _, v := range e.Headers {
		n += len(v)
	}
	buf := make([]byte, 0, n)
	val := func(s string) []byte {
		from := len(buf)
		buf = append(buf, s...)
		return buf[from:len(buf):len(buf)]
	}
	hs := make([]kgo.RecordHeader, 0, 9+len(e.Headers))
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderEventID, Value: val(e.EventID)},
		kgo.RecordHeader{Key: HeaderSource, Value: val(e.Source)},
	)
	from := len(buf)
	buf = strconv.AppendInt(buf, e.Seq, 10)
	hs = append(hs,
		kgo.RecordHeader{Key: HeaderSeq, Value: buf[from:len(buf):len(buf)]},
		kgo.RecordHeader{Key: HeaderEventType, Value: val(e.EventType)},
		kgo.RecordHeader{Key: HeaderContentType, Value: val(ct)},
	)
	if e.Traceparent != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderTraceparent, Value: val(e.Traceparent)})
	}
	if e.Producer != "" {
		hs = append(hs, kgo.RecordHeader{Key: HeaderProducer, Value: val(e.Producer)})
	}
	for _, k := range sortedKeys(e.Headers) {
		hs = append(hs, kgo.RecordHeader{Key: k, Value: val(e.Headers[k])})
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
		if spec.IsReserved(name) {
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
	if e.Traceparent != "" && !spec.IsTraceparent(e.Traceparent) {
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
