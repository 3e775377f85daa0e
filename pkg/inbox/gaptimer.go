package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// gapTimerLimit is how many sources one timer run gives up gaps for; more
// wait for the next tick.
const gapTimerLimit = 100

// runGapTimer gives up expired sequence gaps every GapCheckInterval and
// refreshes the guard gauges, the held effects gauges and the sealed
// filters' gauges, until ctx ends.
// Every replica runs it; the store locks each source with SKIP LOCKED and
// decides on freshly read state, so each gap is given up once. With g nil
// (arrival ordering: no guard) it refreshes the held effects only.
func (c *Consumer) runGapTimer(ctx context.Context, g *seqGuard) {
	t := time.NewTicker(c.cfg.GapCheckInterval)
	defer t.Stop()
	failures := map[string]int{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if g != nil {
			c.gapTick(ctx, g, failures)
		}
		c.refreshHeldEffects(ctx)
		st := c.app.lanes.loadedSealed()
		c.m.sealedFilterBytes.Set(float64(st.bytes))
		c.m.sealedUnloaded.Set(float64(st.unloaded))
	}
}

// maxHeldScopes bounds the scope label of effects_held_by_scope.
const maxHeldScopes = 50

// refreshHeldEffects sets the held effects gauges from the ledger (a
// partial index on status held keeps the count cheap).
func (c *Consumer) refreshHeldEffects(ctx context.Context) {
	byScope, err := effects.HeldCounts(ctx, c.cfg.Pool, "", maxHeldScopes)
	if err != nil {
		if ctx.Err() == nil {
			c.log.WarnContext(ctx, "read held effects", "error", err)
		}
		return
	}
	total, err := effects.CountHeld(ctx, c.cfg.Pool)
	if err != nil {
		if ctx.Err() == nil {
			c.log.WarnContext(ctx, "read held effects", "error", err)
		}
		return
	}
	c.m.effectsHeld.Set(float64(total))
	c.m.effectsHeldByScope.Reset()
	for scope, v := range byScope {
		c.m.effectsHeldByScope.WithLabelValues(scope).Set(float64(v))
	}
}

// gapTick is one run of the gap timer. Errors are logged; the next tick
// tries again (a gap whose give-up rolled back stays open and expired).
func (c *Consumer) gapTick(ctx context.Context, g *seqGuard, failures map[string]int) {
	// Deadlines are compared with the database's clock (a zero time), never
	// this replica's: a skewed replica gives up nothing early or late.
	out, err := c.app.withTimeout(ctx, func(ctx context.Context) (outcome, error) {
		return c.app.giveUpExpired(ctx, g, time.Time{}, failures)
	})
	switch {
	case err == nil:
		c.m.processed.Add(float64(out.processed))
		c.m.deadLettered.Add(float64(out.dead))
		c.m.addGuard(out.guard)
		c.logGivenUp(ctx, out.guard.givenUp, out.deadReleased)
		c.logDeadReleased(ctx, out.deadReleased, "gap timer")
		c.notify(ctx, &out)
		for _, d := range out.deadReleased {
			delete(failures, d.EventID)
		}
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
	st, err := g.store.Stats(ctx, c.cfg.Pool, time.Time{}) // ages on the database's clock
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

// giveUpExpired gives up the gaps expired at now (zero: the database's
// clock) and applies the parked events behind them, in order, in one
// transaction. The handler runs for
// each event under its own savepoint. A handler failure rolls everything
// back (the next tick tries again) and is counted in failures by event id;
// once an event has failed RetryMaxAttempts times, the next try
// dead-letters it instead (status dead with its headers and payload, for
// `consumer dlq replay`, which then delivers it marked late) and applies
// the rest.
func (a *applier) giveUpExpired(ctx context.Context, g *seqGuard, now time.Time, failures map[string]int) (out outcome, err error) {
	begun := time.Now()
	tx, err := a.cfg.Pool.Begin(ctx)
	if err != nil {
		return out, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	probe, err := a.lanes.probeLanes(ctx, a.cfg.Pool, a.cfg.ConsumerName)
	if err != nil {
		return out, err
	}
	outs, err := g.store.GiveUpExpiredIn(ctx, tx, now, gapTimerLimit, probe)
	if err != nil {
		return out, err
	}
	if len(outs) == 0 {
		return out, tx.Commit(ctx)
	}
	// A span only for a run that gives something up.
	ctx, txSpan := a.tr.startTx(ctx, "gap timer transaction", nil, trace.WithTimestamp(begun))
	var releasedSpans []releasedSpan
	defer func() {
		endReleased(releasedSpans, txSpan, &out, err)
		endTx(txSpan, nil, &out, err)
	}()
	var apply []Event
	released := map[string]seqguard.Event{}
	for _, o := range outs {
		evs, err := g.events(o, nil)
		if err != nil {
			return out, err
		}
		releasedSpans = append(releasedSpans, a.tr.startReleased(ctx, evs, releaseReason(o.Steps))...)
		apply = append(apply, evs...)
		out.notes.late = append(out.notes.late, lateNotices(nil, evs, nil)...)
		for _, a := range o.Apply {
			released[a.Event.EventID] = a.Event
		}
		out.guard.addOutcome(o)
	}
	deadOK := func(ev Event) bool {
		if failures == nil {
			return false
		}
		failures[ev.EventID]++
		return failures[ev.EventID] >= a.cfg.RetryMaxAttempts
	}
	if err := a.recordGapTraces(ctx, tx, out.guard.givenUp); err != nil {
		return out, err
	}
	if err := a.runEach(ctx, tx, apply, released, deadOK, &out); err != nil {
		return out, err
	}
	for _, ev := range apply {
		if failures != nil && !out.isDeadReleased(ev.EventID) {
			delete(failures, ev.EventID)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return out, fmt.Errorf("commit: %w", err)
	}
	return out, nil
}

// deadReleased is a released parked event the gap timer dead-lettered.
type deadReleased struct {
	Event
	reason string
}

// logGivenUp logs each given-up gap at ERROR, after its commit, with the
// trace of the transaction that gave it up (when traced) and how many of
// the events released behind it the same transaction dead-lettered (dead).
func (c *Consumer) logGivenUp(ctx context.Context, gaps []givenUpGap, dead []deadReleased) {
	for _, g := range gaps {
		lctx := ctx
		if g.txSpan.IsValid() {
			lctx = trace.ContextWithSpanContext(ctx, g.txSpan)
		}
		n := 0
		for _, d := range dead {
			if d.stream() == g.stream {
				n++
			}
		}
		c.log.ErrorContext(lctx, "sequence gap given up: events of the stream are missing; the events parked after them went on without them (applied, or dead-lettered: see dead_lettered)",
			"source", g.stream.Source, "producer", g.stream.Producer, "topic", g.stream.Topic, "from_seq", g.step.Gap.From, "to_seq", g.step.Gap.To,
			"range", g.step.Gap.String(), "opened_at", g.step.Gap.OpenedAt, "deadline", g.step.Gap.Deadline,
			"reason", string(g.step.Reason), "dead_lettered", n, "trace_ids", g.traceIDs)
	}
}

// runEach runs the handler for evs in order, each under its own savepoint,
// adding to out. When an event's handler fails and deadOK(ev) is true, the
// event is dead-lettered instead (its inbox row, released from parking,
// gets status dead with the headers and payload it had kept, from kept) and
// the rest go on; any other failure is returned, and the caller rolls back.
func (a *applier) runEach(ctx context.Context, tx pgx.Tx, evs []Event, kept map[string]seqguard.Event, deadOK func(Event) bool, out *outcome) error {
	for _, ev := range evs {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return fmt.Errorf("savepoint: %w", err)
		}
		herr := a.runHandler(ctx, sp, []Event{ev})
		if herr == nil {
			if err := sp.Commit(ctx); err != nil {
				return fmt.Errorf("release savepoint: %w", err)
			}
			out.processed++
			continue
		}
		var he *HandlerError
		k, isKept := kept[ev.EventID]
		if !errors.As(herr, &he) || !isKept || !deadOK(ev) {
			return herr
		}
		if err := sp.Rollback(ctx); err != nil {
			return fmt.Errorf("rollback to savepoint: %w", err)
		}
		reason := he.Err.Error()
		if _, err := tx.Exec(ctx, qReleasedDead, a.cfg.ConsumerName, ev.EventID, a.cfg.RetryMaxAttempts, safeText(reason),
			k.Headers, nonNil(k.Payload)); err != nil {
			return fmt.Errorf("dead-letter released event: %w", err)
		}
		out.dead++
		out.deadReleased = append(out.deadReleased, deadReleased{Event: ev, reason: reason})
	}
	return nil
}

func (o *outcome) isDeadReleased(id string) bool {
	for _, d := range o.deadReleased {
		if d.EventID == id {
			return true
		}
	}
	return false
}

// logDeadReleased logs released parked events that were dead-lettered.
func (c *Consumer) logDeadReleased(ctx context.Context, dead []deadReleased, by string) {
	for _, d := range dead {
		c.log.ErrorContext(EventContext(ctx, d.Event), "event dead-lettered", "event_id", d.EventID, "source", d.Source, "seq", d.Seq,
			"attempts", c.cfg.RetryMaxAttempts, "error", d.reason, "released_by", by)
	}
}
