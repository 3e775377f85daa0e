package envelope

import "fmt"

// FieldError says which envelope field is invalid and why.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Reason) }

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
