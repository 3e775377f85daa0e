package outbox

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/onceflow/onceflow/pkg/envelope"
)

// ErrDuplicateEventID is matched (errors.Is) by a *DuplicateEventError.
var ErrDuplicateEventID = errors.New("event id already exists")

// ErrLeadershipLost is returned inside the engine when the lease could not be
// renewed in time; the relay stops publishing and goes back to standby.
var ErrLeadershipLost = errors.New("relay leadership lost")

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
type FieldError = envelope.FieldError

// TopicError is a topic that Config.TopicCheck refused. The relay sets the
// row aside (reason topic_contract) and tries it again later by itself; only
// its source waits. It counts the error under kind "topic".
type TopicError struct {
	Topic string
	Err   error
}

func (e *TopicError) Error() string { return fmt.Sprintf("topic %q: %v", e.Topic, e.Err) }

func (e *TopicError) Unwrap() error { return e.Err }

// ConfigError names the Config field that is invalid.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return fmt.Sprintf("outbox config: %s %s", e.Field, e.Reason) }

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
		return &DuplicateEventError{EventID: eventID}
	}
	return fmt.Errorf("enqueue: %w", err)
}

// isTopicMissing reports whether a produce error means the topic is absent.
func isTopicMissing(err error) bool {
	return errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID)
}

// IdentityError stops the relay (Run returns it): it cannot prove that the
// database it runs against, or a checkpoint it read, is the one it belongs
// to, so using it could mark rows published that never were. Problem says
// what was found, Fix what an operator does about it.
type IdentityError struct {
	Problem string
	Fix     string
}

func (e *IdentityError) Error() string { return e.Problem + ". Fix: " + e.Fix }

// ErrSetAsideNotFound means no open set-aside entry has that outbox id.
var ErrSetAsideNotFound = errors.New("no open set-aside row with that outbox id")

// ErrRetryDue means the set-aside row is being retried (its retry time has
// come): the relay may be publishing it right now, so it cannot be skipped.
var ErrRetryDue = errors.New("a retry of the row is due or running: wait until it is published or set aside again")

// ErrTopicRefused is what a Config.TopicCheck error wraps to say that the
// topic itself is wrong (it breaks its contract), as opposed to the check
// failing to run: the relay then sets the row aside instead of retrying it.
var ErrTopicRefused = errors.New("topic refused")
