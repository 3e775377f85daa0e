package inbox

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNotFound is returned by Replay when the inbox has no row for the event.
var ErrNotFound = errors.New("inbox: event not found")

// ErrRunning is returned by Run when the consumer is already running.
var ErrRunning = errors.New("inbox: consumer already running")

// ConfigError names the Config field that is invalid.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return fmt.Sprintf("inbox config: %s %s", e.Field, e.Reason) }

// HandlerError is a failure of a handler for one event (including a panic).
// It is what gets retried and finally dead-lettered.
type HandlerError struct {
	EventID string
	Err     error

	// withReleased: the failing transaction also applied parked events the
	// sequence guard released, so the failure may be theirs.
	withReleased bool
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("handler for event %s: %v", e.EventID, e.Err)
}

func (e *HandlerError) Unwrap() error { return e.Err }

// ErrUnknownEventType is matched (errors.Is) by the error a Router returns
// for an event type no handler was registered for.
var ErrUnknownEventType = errors.New("no handler for event type")

// Permanent marks err as a failure that trying again cannot fix (an event
// the handler can never apply, such as a payload that does not decode): the
// consumer dead-letters the event at once, with err as the reason, instead
// of retrying it up to RetryMaxAttempts times. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// isPermanent reports whether err is, or wraps, a Permanent error.
func isPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// isRetryableDB reports SQLSTATEs worth retrying as infrastructure trouble
// (deadlock, serialization failure) rather than blaming the event.
func isRetryableDB(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "40001", "40P01":
			return true
		}
	}
	return false
}
