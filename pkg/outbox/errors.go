package outbox

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/envelope/spec"
)

// ErrDuplicateEventID is matched (errors.Is) by a *DuplicateEventError.
var ErrDuplicateEventID = errors.New("event id already exists")

// DuplicateEventError is returned by Enqueue when the given EventID is already
// in the outbox. The statement failed with a unique violation, so the
// caller's transaction is aborted: roll it back (the event was enqueued
// before, by an earlier attempt that committed).
type DuplicateEventError struct {
	EventID string
}

func (e *DuplicateEventError) Error() string {
	return fmt.Sprintf("enqueue: event_id %q already exists in the outbox", e.EventID)
}

// Is makes errors.Is(err, ErrDuplicateEventID) true.
func (e *DuplicateEventError) Is(target error) bool { return target == ErrDuplicateEventID }

// FieldError is an invalid Message field, refused before anything is written.
// It is the envelope's error type: the field names are the contract's.
type FieldError = spec.FieldError

// SQLSTATEs the package interprets.
const (
	sqlstateUniqueViolation = "23505"
	sqlstateDeadlock        = "40P01"
	sqlstateSerialization   = "40001"
)

// IsRetryable reports whether an Enqueue error means "run the whole
// transaction again": a deadlock (40P01) between producers locking the same
// sources in different orders, or a serialization failure (40001).
func IsRetryable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == sqlstateDeadlock || pe.Code == sqlstateSerialization
	}
	return false
}

// interpretEnqueueError translates driver errors at the boundary.
func interpretEnqueueError(err error, eventID string) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == sqlstateUniqueViolation && pe.ConstraintName == "outbox_event_id_key" {
		if eventID == "" { // a batch: the server's detail names the key
			eventID = duplicateKey(pe.Detail)
		}
		return &DuplicateEventError{EventID: eventID}
	}
	return fmt.Errorf("enqueue: %w", err)
}

// duplicateKey is the value in a unique violation's detail,
// "Key (event_id)=(order-88) already exists.".
func duplicateKey(detail string) string {
	_, v, ok := strings.Cut(detail, ")=(")
	if !ok {
		return ""
	}
	v, _, _ = strings.Cut(v, ") already exists")
	return v
}
