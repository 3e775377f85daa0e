package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
	"github.com/onceflow/onceflow/pkg/relay/internal/identity"
)

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
	s.RetriedBy, s.Resolution, s.ResolvedBy, s.Note = identity.Deref(by), identity.Deref(res), identity.Deref(rby), identity.Deref(note)
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
