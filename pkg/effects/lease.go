package effects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Statuses of a lease claim (ClaimLease). StatusDone is the ledger's own.
const (
	// StatusClaimed: the caller holds the key until the lease ends; call
	// the downstream with it, then RecordLease (or ReleaseLease).
	StatusClaimed = "claimed"
	// StatusBusy: another owner holds the key and its lease runs; do not
	// call. Claim again later: the key ends done, or its lease expires.
	StatusBusy = "busy"
)

// Querier runs a query returning one row: pgx.Tx, *pgx.Conn,
// *pgxpool.Conn and *pgxpool.Pool all are one.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Claim is the answer of ClaimLease.
type Claim struct {
	// Status is StatusClaimed, StatusBusy or StatusDone.
	Status string
	// Attempts counts the claims of the key that were granted (calls made
	// or begun), this one included when Status is StatusClaimed.
	Attempts int
	// Result is the recorded result when Status is StatusDone (Replayed set).
	Result Result
	// Owner and LeaseUntil are who holds the key and until when (the
	// database's clock), when Status is StatusClaimed or StatusBusy.
	Owner      string
	LeaseUntil time.Time
}

// The lease protocol's SQL functions (migrations/022_effect_leases.up.sql).
//
// The claim's commit is not waited for on disk (synchronous_commit off for
// its own transaction only): a claim lost in a database crash costs no
// correctness, since the record does not need it (effect_lease_record
// inserts the done row when the claim is missing) and a call made again is
// made with the same key. A claim per event would otherwise wait for a WAL
// flush of its own, which bounded the slow-handler benchmark.
const (
	qLeaseClaim = `SELECT c.status, c.attempts, c.result_code, c.result::text, c.claimed_by, c.lease_until
	  FROM set_config('synchronous_commit', 'off', true) AS sc,
	       onceflow.effect_lease_claim($1, $2, $3, $4, make_interval(secs => $5::float8)) AS c`
	qLeaseRecord  = `SELECT onceflow.effect_lease_record($1, $2, $3, $4::jsonb, $5)`
	qLeaseRelease = `SELECT onceflow.effect_lease_release($1, $2, $3)`
)

// ClaimLease claims key in scope for owner until lease has passed, in one
// short statement that commits on its own: pass a pool or a connection not
// in a transaction (a transaction that has written is refused, and the
// claim makes its transaction's commit asynchronous: see qLeaseClaim). It
// holds nothing once it returns: no transaction, no connection, no lock.
//
// The claim is granted (StatusClaimed) when the key is new, has only an
// intent nobody holds, is held by owner itself (a restarted owner resumes
// its own claims at once), or is held by another owner whose lease has
// expired (a crashed claimant). A key whose result is recorded is
// StatusDone, one held by another owner whose lease runs StatusBusy. Every
// granted claim of a key sends the same key, so a downstream that dedups
// by it applies the effect once, however many claims a crash causes.
//
// A held key (StatusHeld) is refused with a *HeldError.
//
// An owner names one live claimant (a process, or a static consumer group
// member: the consumer uses its instance id when it has one): two live
// claimants must never share an owner.
func ClaimLease(ctx context.Context, db Querier, scope, key, eventID, owner string, lease time.Duration) (Claim, error) {
	if err := ValidateScope(scope); err != nil {
		return Claim{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Claim{}, err
	}
	if owner == "" {
		return Claim{}, errors.New("effects: claim: owner is empty")
	}
	if lease <= 0 {
		return Claim{}, fmt.Errorf("effects: claim: lease must be positive, got %s", lease)
	}
	var (
		a    claimAnswer
		evID any
	)
	if eventID != "" {
		evID = eventID
	}
	err := db.QueryRow(ctx, qLeaseClaim, key, scope, evID, owner, lease.Seconds()).Scan(a.dest()...)
	if herr, ok := heldErr(err, scope, key); ok {
		return Claim{}, herr
	}
	if err != nil {
		return Claim{}, fmt.Errorf("effects: claim %q: %w", key, err)
	}
	return a.claim(), nil
}

// claimAnswer is a lease claim's answer as scanned (effect_lease_claim,
// effect_lease_claim_many): its status and attempts, and the nullable
// columns.
type claimAnswer struct {
	status   string
	attempts int
	code     *int
	sum      *string
	by       *string
	until    *time.Time
}

// dest are the scan destinations of status, attempts, result_code, result,
// claimed_by and lease_until.
func (a *claimAnswer) dest() []any {
	return []any{&a.status, &a.attempts, &a.code, &a.sum, &a.by, &a.until}
}

func (a *claimAnswer) claim() Claim {
	c := Claim{Status: a.status, Attempts: a.attempts}
	if a.code != nil {
		c.Result.Code = *a.code
	}
	if a.sum != nil {
		c.Result.Summary = json.RawMessage(*a.sum)
	}
	if a.by != nil {
		c.Owner = *a.by
	}
	if a.until != nil {
		c.LeaseUntil = *a.until
	}
	c.Result.Replayed = c.Status == StatusDone
	return c
}

// RecordLease records the result of a call made under a lease claim
// (status done). Run it in the transaction the result belongs with (the
// consumer records in the event's inbox transaction), or on its own. It
// reports false when the key was done already: a claimant that took over
// an expired lease recorded first, and its result is kept (both calls sent
// the same key). A key without a row (its claim was lost in a database
// crash) is recorded done all the same.
func RecordLease(ctx context.Context, db Querier, scope, key string, res Result) (bool, error) {
	return RecordLeaseOf(ctx, db, scope, key, "", res)
}

// RecordLeaseOf is RecordLease naming the event the effect belongs to, kept
// when the claim's row is missing (see qLeaseClaim) and the record inserts
// it.
func RecordLeaseOf(ctx context.Context, db Querier, scope, key, eventID string, res Result) (bool, error) {
	sql, args, err := RecordLeaseQuery(scope, key, eventID, res)
	if err != nil {
		return false, err
	}
	var recorded bool
	if err := db.QueryRow(ctx, sql, args...).Scan(&recorded); err != nil {
		return false, fmt.Errorf("effects: record result of %q: %w", key, err)
	}
	return recorded, nil
}

// RecordLeaseQuery is the statement RecordLeaseOf runs, with its
// arguments, for a caller that sends it in a batch of its own (pgx.Batch):
// one row, one boolean column (recorded).
func RecordLeaseQuery(scope, key, eventID string, res Result) (string, []any, error) {
	var summary any
	if len(res.Summary) > 0 {
		if !json.Valid(res.Summary) {
			return "", nil, fmt.Errorf("effects: result summary of %q is not JSON", key)
		}
		summary = string(res.Summary)
	}
	var evID any
	if eventID != "" {
		evID = eventID
	}
	return qLeaseRecord, []any{key, scope, res.Code, summary, evID}, nil
}

// ReleaseLease drops owner's lease on key after a failed call: the intent
// stays and the next claim (by anyone) calls again with the same key. It
// reports whether owner held the key.
func ReleaseLease(ctx context.Context, db Querier, scope, key, owner string) (bool, error) {
	var held bool
	if err := db.QueryRow(ctx, qLeaseRelease, key, scope, owner).Scan(&held); err != nil {
		return false, fmt.Errorf("effects: release %q: %w", key, err)
	}
	return held, nil
}

// maxBusyWait caps the wait between two claims of a busy key.
const maxBusyWait = time.Second

// ClaimWait is ClaimLease that waits while the key is busy: it claims again
// until the claim is granted or the key is done (or ctx ends). Between two
// claims it holds no connection.
func ClaimWait(ctx context.Context, db Querier, scope, key, eventID, owner string, lease time.Duration) (Claim, error) {
	return claimWait(ctx, key, func() (Claim, error) { return ClaimLease(ctx, db, scope, key, eventID, owner, lease) })
}

// claimWait runs claim until the key is not busy (or ctx ends), waiting
// longer each time, at most maxBusyWait.
func claimWait(ctx context.Context, key string, claim func() (Claim, error)) (Claim, error) {
	wait := 20 * time.Millisecond
	for {
		c, err := claim()
		if err != nil || c.Status != StatusBusy {
			return c, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return Claim{}, fmt.Errorf("effects: claim %q: held by %s until %s: %w", key, c.Owner, c.LeaseUntil.Format(time.RFC3339Nano), ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, maxBusyWait)
	}
}

// DoLeased performs call at most once per recorded result for key within
// scope, like DoScoped, but holds no connection (and no transaction) while
// call runs:
//
//  1. ClaimWait: a short statement records the intent, claimed by owner
//     until lease has passed (waiting while another live owner holds the
//     key; a recorded result is returned with Replayed set, without calling).
//  2. call(ctx, key), with ctx ending when the lease does: a call never
//     outlives its claim, so a claimant that takes over an expired lease
//     never calls while this one still does.
//  3. RecordLease in a statement of its own (status done). A failed call
//     releases the lease (ReleaseLease); the intent stays, and the next
//     attempt calls again with the same key.
//
// A crash between 1 and 3 leaves the claim: the same owner claims it again
// at once, any other owner when the lease has expired; the key sent is the
// same, so a downstream that dedups by it applies the effect once.
func DoLeased(ctx context.Context, db Querier, scope, key, owner string, lease time.Duration, call CallFunc) (Result, error) {
	return doLeased(ctx, db, scope, key, owner, lease, Options{}, call)
}

func doLeased(ctx context.Context, db Querier, scope, key, owner string, lease time.Duration, opts Options, call CallFunc) (Result, error) {
	start := time.Now() // before the claim: the local deadline ends before the database's lease
	c, err := ClaimWait(ctx, db, scope, key, eventIDString(ctx), owner, lease)
	if err != nil {
		return Result{}, err
	}
	if c.Status == StatusDone {
		return c.Result, nil
	}
	past, age, err := pastWindow(ctx, db, opts, scope, key, c.Attempts)
	if err == nil && past {
		var found *Result
		found, err = settle(ctx, db, opts, scope, key, c.Attempts, age)
		if err == nil && found != nil {
			if _, err := RecordLeaseOf(context.WithoutCancel(ctx), db, scope, key, eventIDString(ctx), *found); err != nil {
				return Result{}, err
			}
			r := *found
			r.Replayed, r.Reconciled = true, true
			return r, nil
		}
		if errors.Is(err, ErrHeld) {
			return Result{}, err // effect_hold dropped the lease
		}
	}
	if err != nil {
		if _, rerr := ReleaseLease(context.WithoutCancel(ctx), db, scope, key, owner); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return Result{}, err
	}
	cctx, cancel := context.WithDeadline(ctx, start.Add(lease))
	res, err := call(cctx, key)
	cancel()
	if err != nil {
		if _, rerr := ReleaseLease(context.WithoutCancel(ctx), db, scope, key, owner); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return Result{}, fmt.Errorf("effects: call %q: %w", key, err)
	}
	if _, err := RecordLeaseOf(context.WithoutCancel(ctx), db, scope, key, eventIDString(ctx), res); err != nil {
		return Result{}, err
	}
	res.Replayed = false
	return res, nil
}

func eventIDString(ctx context.Context) string {
	if v, ok := ctx.Value(eventIDKey{}).(string); ok {
		return v
	}
	return ""
}
