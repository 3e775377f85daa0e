package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// gapTimerLimit is how many sources one timer run gives up gaps for; more
// wait for the next tick.
const gapTimerLimit = 100

// runGapTimer gives up expired sequence gaps every GapCheckInterval and
// refreshes the guard gauges, until ctx ends. Every replica runs it; the
// store locks each source with SKIP LOCKED and decides on freshly read
// state, so each gap is given up once.
func (c *Consumer) runGapTimer(ctx context.Context, g *seqGuard) {
	t := time.NewTicker(c.cfg.GapCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.gapTick(ctx, g)
	}
}

// gapTick is one run of the gap timer. Errors are logged; the next tick
// tries again (a gap whose give-up rolled back stays open and expired).
func (c *Consumer) gapTick(ctx context.Context, g *seqGuard) {
	now := time.Now()
	out, err := c.app.withTimeout(ctx, func(ctx context.Context) (outcome, error) { return c.app.giveUpExpired(ctx, g, now) })
	switch {
	case err == nil:
		c.m.processed.Add(float64(out.processed))
		c.m.addGuard(out.guard)
		c.logGivenUp(ctx, out.guard.givenUp)
	case ctx.Err() != nil:
		return // stopping
	default:
		var he *HandlerError
		if errors.As(err, &he) {
			c.m.handlerErrors.Inc()
			c.log.ErrorContext(ctx, "gap timer: handler failed on a released parked event; rolled back, retrying next tick",
				"event_id", he.EventID, "error", he.Err.Error())
		} else {
			c.log.WarnContext(ctx, "gap timer", "error", err)
		}
	}
	st, err := g.store.Stats(ctx, c.cfg.Pool, time.Now())
	if err != nil {
		if ctx.Err() == nil {
			c.log.WarnContext(ctx, "gap timer: read guard stats", "error", err)
		}
		return
	}
	c.m.gapsOpen.Set(float64(st.OpenGaps))
	c.m.oldestGap.Set(st.OldestOpenGapAge.Seconds())
	c.m.parkedNow.Set(float64(st.Parked))
	c.m.heldNow.Set(float64(st.Held))
}

// giveUpExpired gives up the gaps expired at now and applies the parked
// events behind them, in order, in one transaction.
func (a *applier) giveUpExpired(ctx context.Context, g *seqGuard, now time.Time) (out outcome, err error) {
	tx, err := a.cfg.Pool.Begin(ctx)
	if err != nil {
		return out, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	outs, err := g.store.GiveUpExpired(ctx, tx, now, gapTimerLimit)
	if err != nil {
		return out, err
	}
	if len(outs) == 0 {
		return out, tx.Commit(ctx)
	}
	var apply []Event
	for _, o := range outs {
		evs, err := g.events(o, nil)
		if err != nil {
			return out, err
		}
		apply = append(apply, evs...)
		out.guard.addOutcome(o)
	}
	if len(apply) > 0 {
		if err := a.runHandler(ctx, tx, apply); err != nil {
			return out, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return out, fmt.Errorf("commit: %w", err)
	}
	out.processed = len(apply)
	return out, nil
}

// logGivenUp logs each given-up gap at ERROR, after its commit.
func (c *Consumer) logGivenUp(ctx context.Context, gaps []givenUpGap) {
	for _, g := range gaps {
		c.log.ErrorContext(ctx, "sequence gap given up: events of the source are missing; the events after them were applied without them",
			"source", g.source, "from_seq", g.step.Gap.From, "to_seq", g.step.Gap.To,
			"range", g.step.Gap.String(), "opened_at", g.step.Gap.OpenedAt, "deadline", g.step.Gap.Deadline,
			"reason", string(g.step.Reason))
	}
}
