package envelope

import (
	"fmt"

	"github.com/onceflow/onceflow/pkg/envelope/spec"
)

// FieldError says which envelope field is invalid and why.
type FieldError = spec.FieldError

// MalformedError is a record that breaks the envelope contract. It names the
// record's position so that an operator can find it.
type MalformedError struct {
	Topic     string
	Partition int32
	Offset    int64
	Field     string
	Reason    string
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("malformed record %s/%d@%d: %s %s", e.Topic, e.Partition, e.Offset, e.Field, e.Reason)
}

// PayloadError is a payload that violates the JSON Schema declared for its
// event type. Violation is the validator's description (instance locations
// and what failed).
type PayloadError = spec.PayloadError

// Codec turns a Go value into a payload and back (spec.Codec).
type Codec = spec.Codec

// JSONCodec is the default Codec: encoding/json, ContentTypeJSON
// (spec.JSONCodec).
type JSONCodec = spec.JSONCodec
