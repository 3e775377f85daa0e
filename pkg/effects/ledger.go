package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// Result is what a call returned, recorded in the ledger.
type Result struct {
	// Code is a status code (e.g. the HTTP status); result_code.
	Code int
	// Summary is a small JSON document describing the response (a hash, a
	// downstream id); result. Nil is stored as SQL NULL.
	Summary json.RawMessage
	// Replayed is true when the result came from the ledger and the call
	// was not made.
	Replayed bool
	// Reconciled is true when the result came from the downstream's
	// reconcile hook (Options.Reconcile) and the call was not made;
	// Replayed is set too.
	Reconciled bool
}

// Status of a ledger row (and StatusHeld).
const (
	StatusIntent = "intent"
	StatusDone   = "done"
)

// CallFunc performs the side effect, sending key to the downstream as its
// idempotency key.
type CallFunc func(ctx context.Context, key string) (Result, error)

type eventIDKey struct{}

// WithEventID returns ctx carrying the id of the event the effect belongs
// to; Do stores it in the ledger row (event_id) for operators.
func WithEventID(ctx context.Context, eventID string) context.Context {
	return context.WithValue(ctx, eventIDKey{}, eventID)
}

func eventIDFrom(ctx context.Context) any {
	if v, ok := ctx.Value(eventIDKey{}).(string); ok && v != "" {
		return v
	}
	return nil
}

// Do is DoScoped with the empty scope: for callers that own the whole
// ledger, or whose keys are unique across every caller of it.
func Do(ctx context.Context, db *pgxpool.Pool, key string, call CallFunc) (Result, error) {
	return DoScoped(ctx, db, "", key, call)
}

// DoScoped performs call at most once per recorded result for key within
// scope. A scope names the owner of a set of effects (the consumer's http
// handler uses ConsumerScope); the same key in two scopes is two effects,
// each called and recorded once. The key is what the downstream sees; the
// scope is never sent.
//
// It runs the ledger's protocol through its SQL functions (migration 007),
// the ones programs in other languages call too, so Go and those programs
// share one ledger:
//
//  1. onceflow.effect_claim takes the session advisory lock of (scope, key)
//     (on a connection of its own, never the caller's transaction), so two
//     callers with the same scope and key never call at the same time: the
//     second waits and then finds the first's result. A crash releases the
//     lock with the session. In the same auto-committed statement it records
//     the intent (status intent, attempts+1), so the intent survives a crash
//     during the call. A row that is already done is returned as is, with
//     Replayed set, and call is not made.
//     A key another caller claimed with the lease protocol (DoLeased, the
//     http handler, the Python fence), whose lease still runs, is busy: the
//     claim changes nothing, and DoScoped waits, holding no connection, and
//     claims again until that caller has recorded (replayed here) or its
//     lease has run out (called here, with the same key).
//  2. It calls call(ctx, key). An error leaves the intent in place
//     (onceflow.effect_release): the next attempt calls again with the same
//     key and the downstream dedups.
//  3. onceflow.effect_record records the result (status done, result_code,
//     result, completed_at) and releases the key.
//
// DoScoped must not be given the caller's inbox transaction: the intent has
// to be committed before the call whatever becomes of that transaction.
//
// A held key (StatusHeld, see DoWith) is not called: DoScoped returns a
// *HeldError.
func DoScoped(ctx context.Context, db *pgxpool.Pool, scope, key string, call CallFunc) (Result, error) {
	return doScoped(ctx, db, scope, key, Options{}, call)
}

func doScoped(ctx context.Context, db *pgxpool.Pool, scope, key string, opts Options, call CallFunc) (Result, error) {
	if err := ValidateScope(scope); err != nil {
		return Result{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Result{}, err
	}
	var (
		conn     *pgxpool.Conn
		status   string
		attempts int
		code     *int
		sum      []byte
		locked   bool
	)
	defer func() {
		if conn == nil {
			return
		}
		if locked {
			if _, err := conn.Exec(context.WithoutCancel(ctx), qRelease, key, scope); err != nil {
				// Never hand a connection holding the key back to the pool.
				_ = conn.Conn().Close(context.WithoutCancel(ctx))
			}
		}
		conn.Release()
	}()
	// A claimant of the lease protocol (DoLeased, the http handler, the
	// Python fence) in its call holds no lock: effect_claim answers busy
	// while its lease runs (migration 027). Wait, holding no connection,
	// and claim again: its result, once recorded, is replayed.
	wait := busyWaitMin
	for {
		var err error
		if conn, err = db.Acquire(ctx); err != nil {
			return Result{}, fmt.Errorf("effects: acquire connection: %w", err)
		}
		err = conn.QueryRow(ctx, qClaim, key, scope, eventIDFrom(ctx)).Scan(&status, &attempts, &code, &sum)
		if herr, ok := heldErr(err, scope, key); ok {
			return Result{}, herr // effect_claim released the key before refusing it
		}
		if err != nil {
			// A cancelled wait or a failed claim may leave the session's lock
			// state unknown: close it rather than reuse it.
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
			return Result{}, fmt.Errorf("effects: claim %q: %w", key, err)
		}
		if status != StatusBusy {
			break
		}
		conn.Release()
		conn = nil
		select {
		case <-ctx.Done():
			return Result{}, fmt.Errorf("effects: claim %q: another claimant's lease runs: %w", key, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, busyWaitMax)
	}
	if status == StatusDone {
		r := Result{Summary: sum, Replayed: true}
		if code != nil {
			r.Code = *code
		}
		return r, nil
	}
	locked = true

	past, age, err := pastWindow(ctx, conn, opts, scope, key, attempts)
	if err != nil {
		return Result{}, err
	}
	if past {
		found, err := settle(ctx, conn, opts, scope, key, attempts, age)
		if errors.Is(err, ErrHeld) {
			locked = false // effect_hold released the key
		}
		if err != nil {
			return Result{}, err
		}
		if found != nil {
			r, err := recordReconciled(ctx, conn, scope, key, *found)
			if err == nil {
				locked = false // effect_record released the key
			}
			return r, err
		}
	}

	res, err := call(ctx, key)
	if err != nil {
		return Result{}, fmt.Errorf("effects: call %q: %w", key, err)
	}
	var summary any
	if len(res.Summary) > 0 {
		if !json.Valid(res.Summary) {
			return Result{}, fmt.Errorf("effects: result summary of %q is not JSON", key)
		}
		summary = string(res.Summary)
	}
	if _, err := conn.Exec(context.WithoutCancel(ctx), qRecord, key, scope, res.Code, summary); err != nil {
		return Result{}, fmt.Errorf("effects: record result of %q: %w", key, err)
	}
	locked = false // effect_record released the key
	res.Replayed = false
	return res, nil
}

// recordReconciled records what the reconcile hook found (effect_record
// releases the key).
func recordReconciled(ctx context.Context, conn *pgxpool.Conn, scope, key string, found Result) (Result, error) {
	var summary any
	if len(found.Summary) > 0 {
		summary = string(found.Summary)
	}
	if _, err := conn.Exec(context.WithoutCancel(ctx), qRecord, key, scope, found.Code, summary); err != nil {
		return Result{}, fmt.Errorf("effects: record reconciled result of %q: %w", key, err)
	}
	found.Replayed, found.Reconciled = true, true
	return found, nil
}

// How long DoScoped waits between two claims of a key another claimant's
// lease holds: doubling from busyWaitMin up to busyWaitMax.
const (
	busyWaitMin = 20 * time.Millisecond
	busyWaitMax = time.Second
)

// The protocol's SQL functions (migrations/007_effects_protocol.up.sql).
const (
	qClaim   = `SELECT status, attempts, result_code, result::text FROM onceflow.effect_claim($1, $2, $3)`
	qRecord  = `SELECT onceflow.effect_record($1, $2, $3, $4::jsonb)`
	qRelease = `SELECT onceflow.effect_release($1, $2)`
)

// Entry is one ledger row.
type Entry struct {
	Scope    string
	Key      string
	EventID  string
	Status   string
	Attempts int
	Result   Result
}

// Lookup returns the ledger row of key in the empty scope, or ok=false.
func Lookup(ctx context.Context, db dbtx.DB, key string) (e Entry, ok bool, err error) {
	return LookupScoped(ctx, db, "", key)
}

// LookupScoped returns the ledger row of key in scope, or ok=false.
func LookupScoped(ctx context.Context, db dbtx.DB, scope, key string) (e Entry, ok bool, err error) {
	var (
		eventID *string
		code    *int
		sum     *string
	)
	err = db.QueryRow(ctx, `SELECT scope, idempotency_key, event_id, status, attempts, result_code, result::text
	  FROM onceflow.effects WHERE owner = onceflow.effect_row_owner($1, $2) AND scope = $1 AND idempotency_key = $2`, scope, key).
		Scan(&e.Scope, &e.Key, &eventID, &e.Status, &e.Attempts, &code, &sum)
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("effects: lookup %q: %w", key, err)
	}
	if eventID != nil {
		e.EventID = *eventID
	}
	if code != nil {
		e.Result.Code = *code
	}
	if sum != nil {
		e.Result.Summary = json.RawMessage(*sum)
	}
	return e, true, nil
}
