// Package lease is a relay shard's lease (onceflow.relay_lease): who may
// publish the shard, for how long, and under which epoch. It takes, renews
// and releases the lease and says what it found; what to do about it
// (stand by, settle another layout, log, count) is the caller's. It
// imports nothing of the relay.
//
// The lease's deadline is measured on this process's monotonic clock from
// before each statement that took or renewed it, so that Valid never
// outlives the lease in the database, whatever the statement's latency.
package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// Config says which lease and how long it lasts.
type Config struct {
	DB     dbtx.DB
	Shard  string // the shard's name
	Shards int    // the shard count (the layout)
	Holder string // this relay's holder id
	TTL    time.Duration
}

// Lease is one relay's view of its shard's lease. It is the only writer of
// the deadline; any goroutine may ask Valid.
type Lease struct {
	cfg        Config
	start      time.Time
	validUntil atomic.Int64 // deadline, nanoseconds since start (monotonic)
}

// New returns the lease, not yet taken.
func New(cfg Config) *Lease { return &Lease{cfg: cfg, start: time.Now()} }

// Found is what an attempt to take the lease found. Exactly one of these
// holds: Taken (Epoch is the new term's), Held (another relay holds it),
// Busy (another relay holds the lease lock: taking a lease, or settling
// another layout), or len(Others) > 0 (leases of another layout exist; none
// was taken).
type Found struct {
	Taken  bool
	Epoch  int64
	Held   bool
	Busy   bool
	Others Others
}

var (
	errBusy = errors.New("lease lock busy")
	errHeld = errors.New("lease held")
)

// TryAcquire takes the shard's lease unless another relay holds it, another
// relay holds the lease lock, or leases of another layout exist. The
// advisory lock makes the check and the take one step among relays. An
// error is the statement's (the database unreachable, ctx ended).
func (l *Lease) TryAcquire(ctx context.Context) (Found, error) {
	t0 := time.Since(l.start)
	qctx, cancel := context.WithTimeout(ctx, l.cfg.TTL)
	defer cancel()
	var f Found
	err := pgx.BeginFunc(qctx, l.cfg.DB, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(qctx, qLeaseTryLock).Scan(&locked); err != nil {
			return err
		}
		if !locked {
			return errBusy
		}
		var err error
		if f.Others, err = readOthers(qctx, tx, l.cfg.Shards, l.cfg.Shard); err != nil || len(f.Others) > 0 {
			return err
		}
		err = tx.QueryRow(qctx, qAcquireLease, l.cfg.Shard, l.cfg.Holder, l.cfg.TTL.Seconds(), l.cfg.Shards).Scan(&f.Epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			return errHeld
		}
		return err
	})
	switch {
	case errors.Is(err, errBusy):
		return Found{Busy: true}, nil
	case errors.Is(err, errHeld):
		return Found{Held: true}, nil
	case err != nil:
		return Found{}, err
	case len(f.Others) > 0:
		return Found{Others: f.Others}, nil
	}
	f.Taken = true
	l.validUntil.Store(int64(t0 + l.cfg.TTL))
	return f, nil
}

// Valid reports whether the lease is still ours by this process's clock.
func (l *Lease) Valid() bool { return l.Remaining() > 0 }

// Remaining is how long the lease lasts without a renewal (<= 0: it ran
// out).
func (l *Lease) Remaining() time.Duration {
	return time.Duration(l.validUntil.Load()) - time.Since(l.start)
}

// Renew extends the lease of term epoch, waiting at most wait (at least a
// millisecond). held is false when the lease is no longer ours (another
// relay took it, or it expired in the database).
func (l *Lease) Renew(ctx context.Context, epoch int64, wait time.Duration) (held bool, err error) {
	t0 := time.Since(l.start)
	qctx, cancel := context.WithTimeout(ctx, max(wait, time.Millisecond))
	defer cancel()
	tag, err := l.cfg.DB.Exec(qctx, qRenewLease, l.cfg.Shard, l.cfg.Holder, epoch, l.cfg.TTL.Seconds())
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() == 0 {
		return false, nil
	}
	l.validUntil.Store(int64(t0 + l.cfg.TTL))
	return true, nil
}

// Release gives the lease of term epoch up, so that a standby takes over at
// once.
func (l *Lease) Release(ctx context.Context, epoch int64) error {
	_, err := l.cfg.DB.Exec(ctx, qReleaseLease, l.cfg.Shard, l.cfg.Holder, epoch)
	return err
}

// Other is a lease taken by a relay of another layout.
type Other struct {
	Shard  string
	Shards int
	Holder string
	Live   bool
}

// Others are the leases of other layouts.
type Others []Other

// Live reports whether one of them is still held.
func (ls Others) Live() bool {
	return slices.ContainsFunc(ls, func(l Other) bool { return l.Live })
}

func (ls Others) String() string {
	var b strings.Builder
	for i, l := range ls {
		if i > 0 {
			b.WriteString(", ")
		}
		state := "expired"
		if l.Live {
			state = "held by " + l.Holder
		}
		fmt.Fprintf(&b, "shard %q of %d (%s)", l.Shard, l.Shards, state)
	}
	return b.String()
}

// SameCount reports whether a live lease is of shard count shards (with one
// shard: another shard name).
func (ls Others) SameCount(shards int) bool {
	return slices.ContainsFunc(ls, func(l Other) bool { return l.Live && l.Shards == shards })
}

// readOthers reads the leases of another layout than shard of shards
// (qOtherLayoutLeases).
func readOthers(ctx context.Context, tx pgx.Tx, shards int, shard string) (Others, error) {
	rows, err := tx.Query(ctx, qOtherLayoutLeases, shards, shard)
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	ls, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Other, error) {
		var l Other
		err := row.Scan(&l.Shard, &l.Shards, &l.Holder, &l.Live)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	return ls, nil
}

// Settlement holds the lease lock while the leases of another layout are
// settled: no relay takes a lease meanwhile. Others are the leases found
// under the lock.
type Settlement struct {
	tx     pgx.Tx
	Others Others
}

// Settle takes the lease lock (waiting for it) and reads the leases of
// other layouts. The caller ends the settlement with Commit or Rollback.
func (l *Lease) Settle(ctx context.Context) (*Settlement, error) {
	tx, err := l.cfg.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	s := &Settlement{tx: tx}
	if _, err := tx.Exec(ctx, qLeaseLock); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	if s.Others, err = readOthers(ctx, tx, l.cfg.Shards, l.cfg.Shard); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return s, nil
}

// Drop deletes the expired lease o once its last checkpoint is settled.
func (s *Settlement) Drop(ctx context.Context, o Other) error {
	_, err := s.tx.Exec(ctx, qDropLayoutLease, o.Shard, o.Shards)
	return err
}

// Commit ends the settlement, keeping the drops.
func (s *Settlement) Commit(ctx context.Context) error { return s.tx.Commit(ctx) }

// Rollback ends the settlement, undoing the drops; after Commit it does
// nothing.
func (s *Settlement) Rollback(ctx context.Context) { _ = s.tx.Rollback(ctx) }
