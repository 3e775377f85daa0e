package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5"
)

// Outcomes recorded in onceflow.admin_audit.outcome.
const (
	OutcomeOK       = "ok"
	OutcomePartial  = "partial"
	OutcomeRejected = "rejected"
	OutcomeError    = "error"
)

// change is one audited, idempotent change.
type change struct {
	requestID string
	action    string
	caller    Caller
	params    any
	note      string
	// intent, when set, makes the change one whose work commits in
	// transactions of its own (a bulk replay applies each event in its
	// own): see runCommitted.
	intent any
}

// run carries out a change once per request id. In one transaction, held
// open while the change runs, it records the request in
// onceflow.admin_audit (who, what, note), calls work, and stores work's
// result with the outcome. work may use tx (a savepoint, released when the
// outcome is ok or partial, rolled back otherwise) for changes that must
// commit with the audit row, or its own transactions.
//
// A request id that is already recorded is not run again: its stored result
// is decoded into into and repeated is true. If the recorded request was a
// different one, ErrRequestIDReused. A concurrent request with the same id
// waits for the first one's transaction, then gets its result.
func (s *Service) run(ctx context.Context, c change, work func(ctx context.Context, tx pgx.Tx) (result any, outcome string), into any) (auditID int64, repeated bool, err error) {
	if err := checkRequestID(c.requestID); err != nil {
		return 0, false, err
	}
	params, err := json.Marshal(c.params)
	if err != nil {
		return 0, false, fmt.Errorf("encode request: %w", err)
	}
	select {
	case s.changes <- struct{}{}:
		defer func() { <-s.changes }()
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
	if c.intent != nil {
		return s.runCommitted(ctx, c, params, func(ctx context.Context) (any, string) { return work(ctx, nil) }, into)
	}
	tx, err := s.cfg.Pool.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	err = tx.QueryRow(ctx, qClaim, c.requestID, s.cfg.Consumer, c.action, c.caller.Actor, c.caller.Via, params, c.note).Scan(&auditID)
	if errors.Is(err, pgx.ErrNoRows) {
		_ = tx.Rollback(ctx)
		var same bool
		var outcome string
		var result []byte
		if err := s.cfg.Pool.QueryRow(ctx, qStored, c.requestID, s.cfg.Consumer, c.action, params).Scan(&auditID, &same, &outcome, &result); err != nil {
			return 0, false, fmt.Errorf("read earlier request %s: %w", c.requestID, err)
		}
		if !same {
			return auditID, false, fmt.Errorf("%w: request id %q (audit #%d); use a new request id for a new change", ErrRequestIDReused, c.requestID, auditID)
		}
		if err := json.Unmarshal(result, into); err != nil {
			return auditID, true, fmt.Errorf("decode result of request %s: %w", c.requestID, err)
		}
		return auditID, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("record request: %w", err)
	}
	// work runs under a savepoint: what it wrote through tx commits with
	// the audit row only if it succeeded.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return auditID, false, fmt.Errorf("savepoint: %w", err)
	}
	result, outcome := work(ctx, sp)
	if outcome == OutcomeOK || outcome == OutcomePartial {
		err = sp.Commit(ctx)
	} else {
		err = sp.Rollback(ctx)
	}
	if err != nil {
		return auditID, false, fmt.Errorf("end savepoint: %w", err)
	}
	body, err := json.Marshal(result)
	if err != nil {
		return auditID, false, fmt.Errorf("encode result: %w", err)
	}
	// The change has happened: record it even if the caller went away.
	wctx := context.WithoutCancel(ctx)
	if _, err := tx.Exec(wctx, qFinish, auditID, outcome, body); err != nil {
		return auditID, false, fmt.Errorf("record result: %w", err)
	}
	if err := tx.Commit(wctx); err != nil {
		return auditID, false, fmt.Errorf("commit audit: %w", err)
	}
	if err := json.Unmarshal(body, into); err != nil {
		return auditID, false, err
	}
	return auditID, false, nil
}

// runCommitted carries out a change whose work commits in transactions of
// its own, so that no part of it is ever applied without an audit row:
//
//  1. On a connection of its own, the change takes a session advisory lock
//     on its request id (a second request with the same id waits here for
//     the first to end), then records its intent (the request and
//     c.intent, e.g. how many events match) as a committed 'running' row.
//  2. work runs; each of its transactions commits on its own.
//  3. The outcome and result are recorded (outcome from 'running' to the
//     final one: the only change the audit accepts).
//
// A request id found 'running' while this session holds its lock was left
// by a session that ended part-way (killed, timed out, crashed): the row is
// finished as 'error' with error_kind "interrupted", keeping the intent, and
// that is what the retry reports. It never runs the change a second time.
func (s *Service) runCommitted(ctx context.Context, c change, params []byte, work func(ctx context.Context) (result any, outcome string), into any) (auditID int64, repeated bool, err error) {
	intent, err := json.Marshal(c.intent)
	if err != nil {
		return 0, false, fmt.Errorf("encode intent: %w", err)
	}
	conn, err := s.cfg.Pool.Acquire(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("acquire: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, qLockRequest, c.requestID); err != nil {
		return 0, false, fmt.Errorf("lock request %s: %w", c.requestID, err)
	}
	defer func() {
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), qUnlockRequest, c.requestID); uerr != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx)) // the lock goes with the session
		}
	}()
	err = conn.QueryRow(ctx, qClaimIntent, c.requestID, s.cfg.Consumer, c.action, c.caller.Actor, c.caller.Via, params, c.note, intent).Scan(&auditID)
	if errors.Is(err, pgx.ErrNoRows) {
		var same bool
		var outcome string
		var result []byte
		if err := conn.QueryRow(ctx, qStored, c.requestID, s.cfg.Consumer, c.action, params).Scan(&auditID, &same, &outcome, &result); err != nil {
			return 0, false, fmt.Errorf("read earlier request %s: %w", c.requestID, err)
		}
		if !same {
			return auditID, false, fmt.Errorf("%w: request id %q (audit #%d); use a new request id for a new change", ErrRequestIDReused, c.requestID, auditID)
		}
		if outcome == "running" {
			if err := conn.QueryRow(ctx, qInterrupted, auditID, interruptedError).Scan(&result); err != nil {
				return auditID, true, fmt.Errorf("record interrupted request %s: %w", c.requestID, err)
			}
		}
		if err := json.Unmarshal(result, into); err != nil {
			return auditID, true, fmt.Errorf("decode result of request %s: %w", c.requestID, err)
		}
		return auditID, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("record request: %w", err)
	}
	result, outcome := work(ctx)
	body, err := json.Marshal(result)
	if err != nil {
		return auditID, false, fmt.Errorf("encode result: %w", err)
	}
	// The change has happened: record it even if the caller went away, and
	// on another connection if this one was lost.
	wctx := context.WithoutCancel(ctx)
	tag, err := conn.Exec(wctx, qFinish, auditID, outcome, body)
	if err != nil {
		if tag, err = s.cfg.Pool.Exec(wctx, qFinish, auditID, outcome, body); err != nil {
			return auditID, false, fmt.Errorf("record result: %w", err)
		}
	}
	if tag.RowsAffected() == 0 {
		return auditID, false, fmt.Errorf("record result of request %s (audit #%d): it was recorded as interrupted meanwhile (this session lost its connection); its outcome here was %s", c.requestID, auditID, outcome)
	}
	if err := json.Unmarshal(body, into); err != nil {
		return auditID, false, err
	}
	return auditID, false, nil
}

// interruptedError is the error of a change whose session ended before it
// recorded its outcome.
const interruptedError = "interrupted: the session that ran this request ended before recording its outcome; " +
	"some of its events may have been applied (replay again with a new request id: applied events report \"already processed\")"

func checkRequestID(id string) error {
	if id == "" {
		return badRequest("request_id is required: a unique id per change (a UUID), so that a retry does not act twice")
	}
	if len(id) > 200 {
		return badRequest("request_id is %d bytes, at most 200", len(id))
	}
	for _, r := range id {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return badRequest("request_id must be printable characters without spaces")
		}
	}
	return nil
}

// CleanActor makes a caller-supplied name fit for the audit: printable,
// trimmed, at most 100 characters.
func CleanActor(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case unicode.IsSpace(r):
			return ' '
		case !unicode.IsPrint(r):
			return -1
		}
		return r
	}, s)
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > 100 {
		s = string(r[:100])
	}
	return s
}
