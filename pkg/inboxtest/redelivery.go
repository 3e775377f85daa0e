package inboxtest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// Effects counts the effects of ev that the handler made, read inside tx
// (e.g. SELECT count(*) FROM shipments WHERE order_id = …): 1 once the
// event is applied.
type Effects func(ctx context.Context, tx pgx.Tx, ev envelope.Envelope) (int, error)

// checkTimeout bounds each wait of the redelivery checks.
const checkTimeout = 30 * time.Second

// errCrash is what the crashing handler returns after cutting its
// connection.
var errCrash = errors.New("inboxtest: simulated crash before the commit")

// CheckRedelivery runs the three redelivery tests (see the package doc),
// each with an event of its own from newEvent (make each one with Event and
// a new source, e.g. a new order), counting effects with effects. A failed
// check fails the test with what it saw.
func (h *Harness) CheckRedelivery(newEvent func() envelope.Envelope, effects Effects) {
	h.t.Helper()
	for _, c := range []struct {
		name  string
		check func(envelope.Envelope, Effects) error
	}{
		{"same event twice", h.checkTwice},
		{"crash before the commit", h.checkCrash},
		{"two consumers racing", h.checkRace},
	} {
		if err := c.check(newEvent(), effects); err != nil {
			h.t.Errorf("inboxtest: redelivery test %q: %v", c.name, err)
		}
	}
}

// count runs effects in a transaction of its own.
func (h *Harness) count(ctx context.Context, ev envelope.Envelope, effects Effects) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, h.Pool, func(tx pgx.Tx) error {
		var err error
		n, err = effects(ctx, tx, ev)
		return err
	})
	if err != nil {
		return 0, errf("count the effects of %s: %w", ev.EventID, err)
	}
	return n, nil
}

func (h *Harness) expectEffects(ctx context.Context, ev envelope.Envelope, effects Effects, want int, when string) error {
	n, err := h.count(ctx, ev, effects)
	if err != nil {
		return err
	}
	if n != want {
		return errf("%s: %d effects of %s, want %d", when, n, ev.EventID, want)
	}
	return nil
}

// checkTwice: the same record delivered twice is applied once.
func (h *Harness) checkTwice(ev envelope.Envelope, effects Effects) error {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	if res, err := h.apply(ctx, h.applier, ev); err != nil || res.Processed != 1 {
		return errf("first delivery of %s: %+v, %v; want it applied", ev.EventID, res, err)
	}
	if err := h.expectEffects(ctx, ev, effects, 1, "after the first delivery"); err != nil {
		return err
	}
	if res, err := h.apply(ctx, h.applier, ev); err != nil || res != (inbox.ApplyResult{Duplicates: 1}) {
		return errf("second delivery of %s: %+v, %v; want a duplicate", ev.EventID, res, err)
	}
	return h.expectEffects(ctx, ev, effects, 1, "after the second delivery")
}

// checkCrash: the handler's writes are made, then the connection is cut
// before the commit (Postgres rolls the transaction back, as it does for a
// killed process); nothing may remain, and the redelivery applies the event
// once.
func (h *Harness) checkCrash(ev envelope.Envelope, effects Effects) error {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	var inside atomic.Int64
	inside.Store(-1)
	crashing := h.newApplier(inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
		if err := h.cfg.Handler.Handle(ctx, tx, e); err != nil {
			return err
		}
		n, err := effects(ctx, tx, e.Envelope)
		if err != nil {
			return err
		}
		inside.Store(int64(n))
		_ = tx.Conn().Close(context.WithoutCancel(ctx))
		return errCrash
	}))
	res, err := h.apply(ctx, crashing, ev)
	if err == nil {
		return errf("the crashed delivery of %s returned %+v, want an error", ev.EventID, res)
	}
	switch n := inside.Load(); {
	case n < 0:
		return errf("the handler failed on %s before the crash point: %v", ev.EventID, err)
	case n < 1:
		return errf("the handler made no effect of %s that Effects counts (inside its transaction: %d)", ev.EventID, n)
	}
	if n, err := h.count(ctx, ev, effects); err != nil {
		return err
	} else if n != 0 {
		return errf("%d effects of %s survived a crash before the commit: the handler writes outside the transaction it is given", n, ev.EventID)
	}
	if res, err := h.apply(ctx, h.applier, ev); err != nil || res.Processed != 1 {
		return errf("redelivery of %s after the crash: %+v, %v; want it applied", ev.EventID, res, err)
	}
	return h.expectEffects(ctx, ev, effects, 1, "after the redelivery")
}

type applied struct {
	res inbox.ApplyResult
	err error
}

// checkRace: consumer A runs the handler and holds its transaction open;
// consumer B gets the same event meanwhile and must wait on A's inbox row;
// when A commits, B returns the event as a duplicate at once, without
// running the handler.
func (h *Harness) checkRace(ev envelope.Envelope, effects Effects) error {
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	entered, release := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	a := h.newApplier(inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
		if err := h.cfg.Handler.Handle(ctx, tx, e); err != nil {
			return err
		}
		if once.CompareAndSwap(false, true) {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}))
	var bCalls atomic.Int32
	b := h.newApplier(inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
		bCalls.Add(1)
		return h.cfg.Handler.Handle(ctx, tx, e)
	}))
	doneA, doneB := make(chan applied, 1), make(chan applied, 1)
	go func() { res, err := h.apply(ctx, a, ev); doneA <- applied{res, err} }()
	select {
	case <-entered:
	case r := <-doneA:
		return errf("consumer A returned %+v, %v before its handler finished %s", r.res, r.err, ev.EventID)
	case <-ctx.Done():
		return errf("consumer A's handler did not run for %s within %s", ev.EventID, checkTimeout)
	}
	defer func() {
		// Unblock A and wait for both whatever happened.
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	go func() { res, err := h.apply(ctx, b, ev); doneB <- applied{res, err} }()
	// B must wait on A's uncommitted inbox row (a lock), not apply.
	for waiting := false; !waiting; {
		select {
		case r := <-doneB:
			return errf("consumer B returned %+v, %v while A still held %s uncommitted, want it to wait for A", r.res, r.err, ev.EventID)
		case <-ctx.Done():
			return errf("consumer B neither waited on A's transaction nor returned within %s", checkTimeout)
		case <-time.After(5 * time.Millisecond):
		}
		var n int
		if err := h.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			return errf("read pg_stat_activity: %w", err)
		}
		waiting = n > 0
	}
	close(release)
	ra := <-doneA
	if ra.err != nil || ra.res.Processed != 1 {
		return errf("consumer A: %+v, %v; want %s applied", ra.res, ra.err, ev.EventID)
	}
	committed := time.Now()
	var rb applied
	select {
	case rb = <-doneB:
	case <-time.After(5 * time.Second):
		return errf("consumer B still blocked 5s after A committed %s", ev.EventID)
	}
	if rb.err != nil || rb.res != (inbox.ApplyResult{Duplicates: 1}) || bCalls.Load() != 0 {
		return errf("consumer B: %+v, %v, its handler ran %d times; want a duplicate without running the handler", rb.res, rb.err, bCalls.Load())
	}
	h.t.Logf("inboxtest: race on %s: B returned a duplicate %s after A's commit", ev.EventID, time.Since(committed).Round(time.Millisecond))
	return h.expectEffects(ctx, ev, effects, 1, "after the race")
}
