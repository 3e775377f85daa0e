package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/onceflow/onceflow/pkg/dbtx"
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

// SetAside is one entry of onceflow.outbox_set_aside.
type SetAside struct {
	OutboxID     int64
	EventID      string
	Topic        string
	Source       string
	Seq          int64
	EventType    string
	Reason       string
	Error        string
	Attempts     int
	SetAsideAt   time.Time
	LastFailedAt time.Time
	// RetryAt is when the relay tries the row again by itself; nil waits for
	// an operator.
	RetryAt    *time.Time
	RetriedAt  *time.Time
	RetriedBy  string
	ResolvedAt *time.Time
	Resolution string // "", "published" or "skipped"
	ResolvedBy string
	Note       string
	// HeldRows counts the unpublished rows of the source (this one
	// included) while the entry is open.
	HeldRows int64
}

func scanSetAside(r pgx.CollectableRow) (SetAside, error) {
	var s SetAside
	var by, res, rby, note *string
	err := r.Scan(&s.OutboxID, &s.EventID, &s.Topic, &s.Source, &s.Seq, &s.EventType, &s.Reason, &s.Error, &s.Attempts,
		&s.SetAsideAt, &s.LastFailedAt, &s.RetryAt, &s.RetriedAt, &by, &s.ResolvedAt, &res, &rby, &note, &s.HeldRows)
	s.RetriedBy, s.Resolution, s.ResolvedBy, s.Note = deref(by), deref(res), deref(rby), deref(note)
	return s, err
}

// ListSetAside lists the open set-aside rows, or every entry (resolved ones
// too) when all is set.
func ListSetAside(ctx context.Context, db dbtx.DB, all bool) ([]SetAside, error) {
	rows, err := db.Query(ctx, qSetAsideList, all)
	if err != nil {
		return nil, fmt.Errorf("list set-aside rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanSetAside)
	if err != nil {
		return nil, fmt.Errorf("list set-aside rows: %w", err)
	}
	return out, nil
}

// GetSetAside returns the entry of outbox row id, open or resolved.
func GetSetAside(ctx context.Context, db dbtx.DB, id int64) (SetAside, error) {
	rows, err := db.Query(ctx, qSetAsideGet, id)
	if err != nil {
		return SetAside{}, fmt.Errorf("read set-aside row %d: %w", id, err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanSetAside)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, ErrSetAsideNotFound
	}
	return s, err
}

// RetrySetAside makes the relay try the set-aside row again at its next
// poll (after the cause was fixed: the topic's max.message.bytes raised, the
// topic created, …). It is tried alone: published, the entry is resolved and
// its source flows again; refused again, it stays set aside.
func RetrySetAside(ctx context.Context, db dbtx.DB, id int64, note string) error {
	tag, err := db.Exec(ctx, qSetAsideRetry, id, note)
	if err != nil {
		return fmt.Errorf("retry set-aside row %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrSetAsideNotFound
	}
	return nil
}

// SkipSetAside gives the set-aside row up: it is never published. The
// outbox row is deleted and kept, as it was, in the entry (skipped_row),
// with note and the database role that ran it. The rest of its source
// flows again; consumers see its seq missing and give the gap up loudly.
// A note is required.
func SkipSetAside(ctx context.Context, db dbtx.DB, id int64, note string) error {
	if strings.TrimSpace(note) == "" {
		return errors.New("skip set-aside row: a note saying why is required")
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var due bool
		err := tx.QueryRow(ctx, qSetAsideSkipLock, id).Scan(&due)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrSetAsideNotFound
		}
		if err != nil {
			return fmt.Errorf("skip set-aside row %d: %w", id, err)
		}
		if due {
			return ErrRetryDue
		}
		if _, err := tx.Exec(ctx, qSetAsideSkip, id, note); err != nil {
			return fmt.Errorf("skip set-aside row %d: %w", id, err)
		}
		return nil
	})
}
