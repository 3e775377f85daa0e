package relay

import (
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Reasons a row is set aside (onceflow.outbox_set_aside.reason and the label
// of onceflow_relay_set_aside_total).
const (
	ReasonTooLarge           = "too_large"           // MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE: over the topic's max.message.bytes
	ReasonInvalidTopic       = "invalid_topic"       // not a legal Kafka topic name (INVALID_TOPIC_EXCEPTION)
	ReasonInvalidRecord      = "invalid_record"      // INVALID_RECORD, INVALID_TIMESTAMP, UNSUPPORTED_FOR_MESSAGE_FORMAT
	ReasonTopicAuthorization = "topic_authorization" // TOPIC_AUTHORIZATION_FAILED: retried by the relay
	ReasonTopicMissing       = "topic_missing"       // UNKNOWN_TOPIC_OR_PARTITION after the client's retries: retried by the relay
	ReasonTopicContract      = "topic_contract"      // Config.TopicCheck refused the topic: retried by the relay
)

var setAsideReasons = []string{ReasonTooLarge, ReasonInvalidTopic, ReasonInvalidRecord, ReasonTopicAuthorization, ReasonTopicMissing, ReasonTopicContract}

// retriedByRelay reports whether rows set aside for reason are tried again
// by the relay on its own (the cause may go away without touching the row:
// the topic gets created, an ACL granted); the others wait for an operator.
func retriedByRelay(reason string) bool {
	switch reason {
	case ReasonTopicAuthorization, ReasonTopicMissing, ReasonTopicContract:
		return true
	}
	return false
}

// refusal classifies a produce error of one record. A non-empty reason means
// Kafka (or the client, for a record over its own limit) refuses this record
// and will refuse it again: the row is a suspect. Everything else is
// transient: the batch is retried as it is.
func refusal(err error) string {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return ReasonTooLarge
	case errors.Is(err, kerr.InvalidTopicException):
		return ReasonInvalidTopic
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.InvalidTimestamp),
		errors.Is(err, kerr.UnsupportedForMessageFormat):
		return ReasonInvalidRecord
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return ReasonTopicAuthorization
	case isTopicMissing(err):
		return ReasonTopicMissing
	}
	return ""
}

// refusedError is a Kafka transaction that was aborted because Kafka
// refused some of its records for good; Refused maps their outbox ids to the
// reason and the error.
type refusedError struct {
	refused map[int64]refused
}

type refused struct {
	reason string
	err    error
}

func (e *refusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Kafka refused %d record(s): ", len(e.refused))
	n := 0
	for id, r := range e.refused {
		if n == 3 {
			b.WriteString(", …")
			break
		}
		if n > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "row %d: %s (%v)", id, r.reason, r.err)
		n++
	}
	return b.String()
}
