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

// StatusHeld is the status of an effect held for an operator (migration
// 025): a retry of it came after its downstream's idempotency window, and
// no reconcile hook could say what the downstream did. Claims of a held key
// fail with *HeldError until Resolve or Unhold.
const StatusHeld = "held"

// ReconcileFunc asks the downstream what became of the effect sent under
// key ("GET by key"). It returns the effect's result when the downstream
// has it (recorded as the effect's result; nothing is sent), nil when the
// downstream has no such effect (the call goes ahead with the key), or an
// error (nothing is sent or recorded; the intent stays). It must answer
// from the downstream's durable records (a search by the key stored with
// the object, e.g. in its metadata), not from its idempotency cache, which
// has forgotten the key by then.
type ReconcileFunc func(ctx context.Context, key string) (*Result, error)

// Options are the downstream's idempotency rules for DoWith and
// DoLeasedWith. The zero value is Do's behaviour: a retry always calls
// again with the same key.
type Options struct {
	// Reconcile asks the downstream by key when a retry comes after Window.
	// Nil (the default): such a retry holds the effect (StatusHeld) and
	// returns a *HeldError. Needs Window.
	Reconcile ReconcileFunc
	// Window is how long the downstream dedups a key (Stripe: 24 hours).
	// A retry of an intent (an earlier attempt may have called) whose first
	// attempt is older than Window is never sent blindly: it is reconciled
	// (Reconcile) or held. Zero (the default): no window, every retry calls
	// again with the same key.
	Window time.Duration
}

func (o Options) validate() error {
	if o.Window < 0 {
		return fmt.Errorf("effects: Options.Window must not be negative, got %s", o.Window)
	}
	if o.Reconcile != nil && o.Window == 0 {
		return errors.New("effects: Options.Reconcile needs Options.Window: it is asked only for a retry after the downstream's window")
	}
	return nil
}

// The window's SQL functions (migrations/025_effect_hold.up.sql).
const (
	qWindowAge = `SELECT extract(epoch FROM onceflow.effect_window_age($1, $2))::float8`
	qHold      = `SELECT onceflow.effect_hold($1, $2, $3)`
	qResolve   = `SELECT onceflow.effect_resolve($1, $2, $3, $4::jsonb)`
	qUnhold    = `SELECT onceflow.effect_unhold($1, $2)`
)

// pastWindow reports whether a claim granted for the attempts-th time is a
// retry after opts.Window, and the age of the key's window.
func pastWindow(ctx context.Context, db Querier, opts Options, scope, key string, attempts int) (bool, time.Duration, error) {
	if opts.Window <= 0 || attempts <= 1 {
		return false, 0, nil
	}
	var secs *float64
	if err := db.QueryRow(ctx, qWindowAge, key, scope).Scan(&secs); err != nil {
		return false, 0, fmt.Errorf("effects: window age of %q: %w", key, err)
	}
	if secs == nil {
		return false, 0, fmt.Errorf("effects: window age of %q: no ledger row", key)
	}
	age := time.Duration(*secs * float64(time.Second))
	return age > opts.Window, age, nil
}

// settle handles a retry past the window: reconcile through the hook, or
// hold. found is the downstream's answer (nil: call); a held effect
// returns a *HeldError.
func settle(ctx context.Context, db Querier, opts Options, scope, key string, attempts int, age time.Duration) (*Result, error) {
	if opts.Reconcile == nil {
		held := &HeldError{Scope: scope, Key: key, Attempts: attempts, Age: age, Window: opts.Window}
		reason := fmt.Sprintf("attempt %d is %s after the first, past the downstream's idempotency window of %s; no reconcile hook",
			attempts, age.Round(time.Second), opts.Window)
		if _, err := Hold(context.WithoutCancel(ctx), db, scope, key, reason); err != nil {
			// Not a HeldError: the claim is still the caller's to release.
			return nil, fmt.Errorf("effects: retry of %q is past the downstream's window and could not be held (nothing was sent): %w", key, err)
		}
		return nil, held
	}
	found, err := opts.Reconcile(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("effects: reconcile %q: %w", key, err)
	}
	if found != nil && len(found.Summary) > 0 && !json.Valid(found.Summary) {
		return nil, fmt.Errorf("effects: reconciled summary of %q is not JSON", key)
	}
	return found, nil
}

// DoWith is DoScoped with the downstream's idempotency window (opts): a
// retry whose first attempt is older than opts.Window is reconciled
// through opts.Reconcile — a result it finds is recorded and returned with
// Replayed and Reconciled set, and call is not made; nil lets the call go —
// or, without a hook, held (StatusHeld): nothing is sent, a *HeldError is
// returned, and every later claim of the key fails with one until an
// operator runs Resolve or Unhold.
//
// The age is measured from the key's first claim (or the last Unhold),
// which is no later than the first call: the window closes a little early
// rather than late.
func DoWith(ctx context.Context, db *pgxpool.Pool, scope, key string, opts Options, call CallFunc) (Result, error) {
	if err := opts.validate(); err != nil {
		return Result{}, err
	}
	return doScoped(ctx, db, scope, key, opts, call)
}

// DoLeasedWith is DoLeased with the downstream's idempotency window (see
// DoWith): after a granted claim that is a retry past opts.Window, the
// effect is reconciled (a found result is recorded, the lease ends) or held
// (the lease is dropped with the hold).
func DoLeasedWith(ctx context.Context, db Querier, scope, key, owner string, lease time.Duration, opts Options, call CallFunc) (Result, error) {
	if err := opts.validate(); err != nil {
		return Result{}, err
	}
	return doLeased(ctx, db, scope, key, owner, lease, opts, call)
}

// Settle applies opts to a claim a caller ran itself (ClaimLease,
// ClaimWait, effect_claim), granted for the attempts-th time: nil, nil when
// the call may go (not a retry past opts.Window, or the hook found
// nothing); the result to record (with RecordLease, or effect_record on the
// claiming session) when the hook found it; a *HeldError when it held the
// effect (the claim is dropped with the hold: do not call, record or
// release). Any other error leaves the claim to the caller to release.
func Settle(ctx context.Context, db Querier, scope, key string, attempts int, opts Options) (*Result, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	past, age, err := pastWindow(ctx, db, opts, scope, key, attempts)
	if err != nil || !past {
		return nil, err
	}
	return settle(ctx, db, opts, scope, key, attempts, age)
}

// Hold stops an intent for an operator (StatusHeld, with reason): every
// claim of the key then fails with a *HeldError until Resolve or Unhold.
// It drops the key's lease, and the session lock if db's session holds it.
// It reports false when there was no intent to hold (done, held already, or
// no row). DoWith and DoLeasedWith hold on their own; an operator may hold
// an intent to stop its retries.
func Hold(ctx context.Context, db Querier, scope, key, reason string) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, qHold, key, scope, reason).Scan(&ok); err != nil {
		return false, fmt.Errorf("effects: hold %q: %w", key, err)
	}
	return ok, nil
}

// Resolve records the result an operator found downstream for a held
// effect (status done): every later claim replays it, nothing is sent. An
// effect that is not held is an error.
func Resolve(ctx context.Context, db Querier, scope, key string, res Result) error {
	var summary any
	if len(res.Summary) > 0 {
		if !json.Valid(res.Summary) {
			return fmt.Errorf("effects: resolve %q: result summary is not JSON", key)
		}
		summary = string(res.Summary)
	}
	var code any
	if res.Code != 0 {
		code = res.Code
	}
	var void any
	if err := db.QueryRow(ctx, qResolve, key, scope, code, summary).Scan(&void); err != nil {
		return fmt.Errorf("effects: resolve %q: %w", key, err)
	}
	return nil
}

// Unhold lets a held effect send: status intent again, and its window
// restarts now, so the next claim calls the downstream with the same key.
// An effect that is not held is an error.
func Unhold(ctx context.Context, db Querier, scope, key string) error {
	var void any
	if err := db.QueryRow(ctx, qUnhold, key, scope).Scan(&void); err != nil {
		return fmt.Errorf("effects: unhold %q: %w", key, err)
	}
	return nil
}

// Held is one held effect.
type Held struct {
	Scope    string `json:"scope"`
	Key      string `json:"key"`
	EventID  string `json:"event_id,omitempty"`
	Attempts int    `json:"attempts"`
	Reason   string `json:"reason"`
	// Created is the first claim, HeldAt when it was held.
	Created time.Time `json:"created_at"`
	HeldAt  time.Time `json:"held_at"`
}

// HeldFilter selects held effects for ListHeld.
type HeldFilter struct {
	// Consumer, when set, keeps the scopes of that logical consumer
	// (ConsumerScopePrefix) and the scopes of no consumer (not starting
	// with "inbox/": a library's or an agent's), never another consumer's.
	Consumer string
	// ScopePrefix keeps the scopes starting with it ("" for all).
	ScopePrefix string
}

// ListHeld returns the held effects f selects, oldest hold first, at most
// limit.
func ListHeld(ctx context.Context, db dbtx.DB, f HeldFilter, limit int) ([]Held, error) {
	var own any
	if f.Consumer != "" {
		own = ConsumerScopePrefix(f.Consumer)
	}
	rows, err := db.Query(ctx, `SELECT scope, idempotency_key, coalesce(event_id, ''), attempts, coalesce(held_reason, ''), created_at, coalesce(held_at, created_at)
	  FROM onceflow.effects
	 WHERE status = 'held' AND starts_with(scope, $1)
	   AND ($2::text IS NULL OR starts_with(scope, $2) OR NOT starts_with(scope, 'inbox/'))
	 ORDER BY held_at, scope, idempotency_key LIMIT $3`, f.ScopePrefix, own, limit)
	if err != nil {
		return nil, fmt.Errorf("effects: list held: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Held, error) {
		var h Held
		err := r.Scan(&h.Scope, &h.Key, &h.EventID, &h.Attempts, &h.Reason, &h.Created, &h.HeldAt)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("effects: list held: %w", err)
	}
	return out, nil
}

// HeldCounts returns how many effects are held per scope, for the scopes
// starting with scopePrefix ("" for all), the limit scopes with the most.
func HeldCounts(ctx context.Context, db dbtx.DB, scopePrefix string, limit int) (map[string]int, error) {
	rows, err := db.Query(ctx, `SELECT scope, count(*)::int FROM onceflow.effects
	 WHERE status = 'held' AND starts_with(scope, $1)
	 GROUP BY scope ORDER BY count(*) DESC, scope LIMIT $2`, scopePrefix, limit)
	if err != nil {
		return nil, fmt.Errorf("effects: count held: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			s string
			n int
		)
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("effects: count held: %w", err)
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("effects: count held: %w", err)
	}
	return out, nil
}

// CountHeld returns how many effects are held, in every scope.
func CountHeld(ctx context.Context, db dbtx.DB) (int, error) {
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM onceflow.effects WHERE status = 'held'`).Scan(&n); err != nil {
		return 0, fmt.Errorf("effects: count held: %w", err)
	}
	return n, nil
}

// IsHeld reports whether err says an effect is held (a *HeldError, or the
// claim functions' SQLSTATE from a caller that ran them itself).
func IsHeld(err error) bool {
	if errors.Is(err, ErrHeld) {
		return true
	}
	_, ok := heldErr(err, "", "")
	return ok
}
