package effects

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ClaimRequest is one claim of a group (ClaimMany): the arguments of
// ClaimLease.
type ClaimRequest struct {
	Scope, Key, EventID, Owner string
	Lease                      time.Duration
}

// RowsQuerier runs a query returning rows: pgx.Tx, *pgx.Conn,
// *pgxpool.Conn and *pgxpool.Pool all are one.
type RowsQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// qLeaseClaimMany claims a group in one statement
// (migrations/026_effect_lease_claim_many.up.sql), its commit not waited
// for on disk, as qLeaseClaim's.
const qLeaseClaimMany = `SELECT c.i, c.status, c.attempts, c.result_code, c.result::text, c.claimed_by, c.lease_until
	  FROM set_config('synchronous_commit', 'off', true) AS sc,
	       onceflow.effect_lease_claim_many($1::text[], $2::text[], $3::text[], $4::text[],
	           ARRAY(SELECT make_interval(secs => u.s) FROM unnest($5::float8[]) WITH ORDINALITY AS u(s, o) ORDER BY u.o)) AS c`

// validate checks r as ClaimLease checks its arguments.
func (r ClaimRequest) validate() error {
	if err := ValidateScope(r.Scope); err != nil {
		return err
	}
	if err := ValidateKey(r.Key); err != nil {
		return err
	}
	if r.Owner == "" {
		return errors.New("effects: claim: owner is empty")
	}
	if r.Lease <= 0 {
		return fmt.Errorf("effects: claim: lease must be positive, got %s", r.Lease)
	}
	return nil
}

// ClaimMany claims every request of reqs in one statement that commits on
// its own (one round trip, one commit), each by ClaimLease's rules: the
// answer of reqs[i] is the i-th Claim. Pass a pool or a connection not in a
// transaction. A request that is not valid fails the group before anything
// is claimed. A held key (Hold) is not claimed: its answer has Status
// StatusHeld, where ClaimLease returns a *HeldError; the Claimer returns
// that error for it.
func ClaimMany(ctx context.Context, db RowsQuerier, reqs []ClaimRequest) ([]Claim, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	keys := make([]string, len(reqs))
	scopes := make([]string, len(reqs))
	evIDs := make([]*string, len(reqs))
	owners := make([]string, len(reqs))
	leases := make([]float64, len(reqs))
	for i, r := range reqs {
		if err := r.validate(); err != nil {
			return nil, err
		}
		keys[i], scopes[i], owners[i], leases[i] = r.Key, r.Scope, r.Owner, r.Lease.Seconds()
		if r.EventID != "" {
			evIDs[i] = &reqs[i].EventID
		}
	}
	rows, err := db.Query(ctx, qLeaseClaimMany, keys, scopes, evIDs, owners, leases)
	if err != nil {
		return nil, fmt.Errorf("effects: claim %d keys: %w", len(reqs), err)
	}
	defer rows.Close()
	out := make([]Claim, len(reqs))
	seen := 0
	for rows.Next() {
		var (
			i int
			a claimAnswer
		)
		if err := rows.Scan(append([]any{&i}, a.dest()...)...); err != nil {
			return nil, fmt.Errorf("effects: claim %d keys: %w", len(reqs), err)
		}
		if i < 1 || i > len(reqs) {
			return nil, fmt.Errorf("effects: claim %d keys: answer for claim %d", len(reqs), i)
		}
		out[i-1] = a.claim()
		seen++
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("effects: claim %d keys: %w", len(reqs), err)
	}
	if seen != len(reqs) {
		return nil, fmt.Errorf("effects: claim %d keys: %d answers", len(reqs), seen)
	}
	return out, nil
}

// A Claimer sends the claims its callers ask for concurrently in groups,
// as a database's group commit does: while one group's statement runs, the
// claims asked meanwhile wait, and go together in the next statement
// (ClaimMany). A claim asked while none runs is sent at once. Many slow
// calls made at once then cost one statement (and one pooled connection)
// per group instead of one per call; a Claimer holds at most one
// connection at a time.
//
// A Claimer is safe for concurrent use; its zero value is not usable (use
// NewClaimer).
type Claimer struct {
	db       RowsQuerier
	maxGroup int

	mu      sync.Mutex
	pending []*groupClaim
	running bool
}

type groupClaim struct {
	ctx  context.Context
	req  ClaimRequest
	done chan struct{}
	c    Claim
	err  error
}

// NewClaimer returns a Claimer sending its groups on db (a pool), at most
// maxGroup claims in a statement (at least 1).
func NewClaimer(db RowsQuerier, maxGroup int) *Claimer {
	return &Claimer{db: db, maxGroup: max(maxGroup, 1)}
}

// Claim is ClaimLease through the Claimer: the claim goes in the next
// group. When ctx ends first, Claim returns ctx's error, and the claim may
// still be granted: its owner claims it again at once (the same key), any
// other owner after its lease.
func (cl *Claimer) Claim(ctx context.Context, scope, key, eventID, owner string, lease time.Duration) (Claim, error) {
	r := ClaimRequest{Scope: scope, Key: key, EventID: eventID, Owner: owner, Lease: lease}
	if err := r.validate(); err != nil {
		return Claim{}, err
	}
	g := &groupClaim{ctx: ctx, req: r, done: make(chan struct{})}
	cl.mu.Lock()
	cl.pending = append(cl.pending, g)
	if !cl.running {
		cl.running = true
		go cl.send()
	}
	cl.mu.Unlock()
	select {
	case <-g.done:
		return g.c, g.err
	case <-ctx.Done():
		return Claim{}, fmt.Errorf("effects: claim %q: %w", key, ctx.Err())
	}
}

// ClaimWait is effects.ClaimWait through the Claimer: it claims again
// while the key is busy.
func (cl *Claimer) ClaimWait(ctx context.Context, scope, key, eventID, owner string, lease time.Duration) (Claim, error) {
	return claimWait(ctx, key, func() (Claim, error) { return cl.Claim(ctx, scope, key, eventID, owner, lease) })
}

// send runs groups until no claim waits.
func (cl *Claimer) send() {
	for {
		cl.mu.Lock()
		n := min(len(cl.pending), cl.maxGroup)
		if n == 0 {
			cl.running = false
			cl.mu.Unlock()
			return
		}
		group := cl.pending[:n:n]
		cl.pending = cl.pending[n:]
		cl.mu.Unlock()
		// Claims whose caller has gone are not sent.
		live := group[:0:0]
		for _, g := range group {
			if g.ctx.Err() == nil {
				live = append(live, g)
			}
		}
		if len(live) == 0 {
			continue
		}
		reqs := make([]ClaimRequest, len(live))
		for i, g := range live {
			reqs[i] = g.req
		}
		// The group's statement is not cancelled by one caller leaving.
		cs, err := ClaimMany(context.WithoutCancel(live[0].ctx), cl.db, reqs)
		for i, g := range live {
			switch {
			case err != nil:
				g.err = err
			case cs[i].Status == StatusHeld:
				// As a single claim's SQLSTATE OFH01: held for an operator.
				g.err = &HeldError{Scope: g.req.Scope, Key: g.req.Key}
			default:
				g.c = cs[i]
			}
			close(g.done)
		}
	}
}
