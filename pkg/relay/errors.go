package relay

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
)

// ErrLeadershipLost is returned inside the engine when the lease could not be
// renewed in time; the relay stops publishing and goes back to standby.
var ErrLeadershipLost = errors.New("relay leadership lost")

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

// ErrTopicRefused is what a Config.TopicCheck error wraps to say that the
// topic itself is wrong (it breaks its contract), as opposed to the check
// failing to run: the relay then sets the row aside instead of retrying it.
var ErrTopicRefused = errors.New("topic refused")
