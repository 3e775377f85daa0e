// Package wire turns onceflow's envelope (a JSON payload plus headers) into
// the bytes a topic's contract asks for, and back. A topic's wire format is
// json (the payload as written, the default), or avro, protobuf or
// json-schema: the payload encoded with the topic's schema from a schema
// registry and framed the way Confluent's serializers frame it (magic byte 0,
// the 4-byte big-endian schema id, for protobuf the message indexes, then the
// encoded data). Independently a topic may carry its events as CloudEvents
// (Kafka protocol binding, binary or structured mode).
//
// Producers keep writing JSON; the relay encodes with an Encoder, and the
// consumer decodes with a Decoder into the same JSON view every handler sees.
// Every record also carries the contract version it follows
// (HeaderContractVersion). docs/contract.md says how a consumer in another
// language reads each format.
package wire

import (
	"fmt"
	"strconv"
	"strings"
)

// Format is how a topic's record values are encoded.
type Format string

// Wire formats.
const (
	// FormatJSON is the payload as the producer wrote it (the default).
	FormatJSON Format = "json"
	// FormatAvro is Avro binary with Confluent framing.
	FormatAvro Format = "avro"
	// FormatProtobuf is Protobuf binary with Confluent framing (schema id and
	// message indexes).
	FormatProtobuf Format = "protobuf"
	// FormatJSONSchema is the JSON payload, checked against a JSON Schema,
	// with Confluent framing.
	FormatJSONSchema Format = "json-schema"
)

// Formats lists every wire format.
var Formats = []Format{FormatJSON, FormatAvro, FormatProtobuf, FormatJSONSchema}

// ParseFormat parses a format name; "" is json.
func ParseFormat(s string) (Format, error) {
	if s == "" {
		return FormatJSON, nil
	}
	for _, f := range Formats {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("unknown wire format %q (want json, avro, protobuf or json-schema)", s)
}

// Registered reports whether the format needs a schema registry.
func (f Format) Registered() bool {
	return f == FormatAvro || f == FormatProtobuf || f == FormatJSONSchema
}

// ContentType is the content-type header of a record in format f: what the
// bytes of the value are (the CloudEvents datacontenttype in binary mode).
func (f Format) ContentType() string {
	switch f {
	case FormatAvro:
		return ContentTypeAvro
	case FormatProtobuf:
		return ContentTypeProtobuf
	case FormatJSONSchema:
		return ContentTypeJSONSchema
	}
	return "application/json"
}

// Content types of framed values.
const (
	ContentTypeAvro       = "application/vnd.confluent.avro"
	ContentTypeProtobuf   = "application/vnd.confluent.protobuf"
	ContentTypeJSONSchema = "application/vnd.confluent.json"
)

// CloudEvents chooses whether a topic's records are CloudEvents.
type CloudEvents string

// CloudEvents modes (Kafka protocol binding).
const (
	// CloudEventsOff writes onceflow's own envelope headers (the default).
	CloudEventsOff CloudEvents = ""
	// CloudEventsBinary writes the event's attributes as ce_* headers and
	// the data as the value.
	CloudEventsBinary CloudEvents = "binary"
	// CloudEventsStructured writes the whole event as one JSON object in the
	// value (content-type application/cloudevents+json). Only with the json
	// format.
	CloudEventsStructured CloudEvents = "structured"
)

// ParseCloudEvents parses "", "binary" or "structured".
func ParseCloudEvents(s string) (CloudEvents, error) {
	switch CloudEvents(s) {
	case CloudEventsOff, CloudEventsBinary, CloudEventsStructured:
		return CloudEvents(s), nil
	}
	return "", fmt.Errorf("unknown cloudevents mode %q (want binary or structured)", s)
}

// TopicFormat is the wire contract of one topic.
type TopicFormat struct {
	// CloudEvents is "", binary or structured.
	CloudEvents CloudEvents
	// Format is the value encoding; "" means json.
	Format Format
	// Message is the fully qualified Protobuf message the payload is (default:
	// the schema's first message).
	Message string
	// Schema is the schema text: an Avro schema (JSON), a .proto file, or a
	// JSON Schema. Required for the registered formats.
	Schema string
	// Subject is the registry subject; default "<topic>-value" (Confluent's
	// TopicNameStrategy).
	Subject string
}

// SubjectFor is f's subject for topic.
func (f TopicFormat) SubjectFor(topic string) string {
	if f.Subject != "" {
		return f.Subject
	}
	return topic + "-value"
}

// Validate checks f; the error names the field.
func (f *TopicFormat) Validate() error {
	if f.Format == "" {
		f.Format = FormatJSON
	}
	if _, err := ParseFormat(string(f.Format)); err != nil {
		return fmt.Errorf("format: %w", err)
	}
	if _, err := ParseCloudEvents(string(f.CloudEvents)); err != nil {
		return fmt.Errorf("cloudevents: %w", err)
	}
	if f.CloudEvents == CloudEventsStructured && f.Format != FormatJSON {
		return fmt.Errorf("cloudevents: structured mode carries the event as one JSON object, so it needs format json (got %s)", f.Format)
	}
	if f.Format.Registered() {
		if strings.TrimSpace(f.Schema) == "" {
			return fmt.Errorf("schema: format %s needs a schema", f.Format)
		}
		if _, err := compile(f.Format, f.Schema, f.Message); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
	} else if f.Schema != "" || f.Subject != "" || f.Message != "" {
		return fmt.Errorf("schema, subject and message belong to avro, protobuf and json-schema topics, not %s", f.Format)
	}
	return nil
}

// Contract version on the wire.
const (
	// HeaderContractVersion carries the version of docs/contract.md (and
	// contract/VERSION) the record follows, e.g. "1.2.0".
	HeaderContractVersion = "contract-version"
	// HeaderWireFormat names the value's format when it is not json.
	HeaderWireFormat = "wire-format"
	// ContractVersion is the contract version this build writes.
	ContractVersion = "1.2.0"
)

// ContractMajor is the major version of ContractVersion: a consumer refuses
// records of a later major version.
const ContractMajor = 1

// CheckContractVersion checks a record's contract-version header: absent
// (a relay before 1.2.0) or a semantic version whose major this build reads.
func CheckContractVersion(v string) error {
	if v == "" {
		return nil
	}
	majorText, _, ok := strings.Cut(v, ".")
	major, err := strconv.Atoi(majorText)
	if !ok || err != nil || major < 0 {
		return fmt.Errorf("%q is not a version like %s", v, ContractVersion)
	}
	if major > ContractMajor {
		return fmt.Errorf("%s is a later major version than this consumer reads (%s): upgrade the consumer", v, ContractVersion)
	}
	return nil
}
