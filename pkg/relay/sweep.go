package relay

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// The sweep for unqueued rows. The trigger outbox_pending_insert queues
// every inserted row, but only where ordinary triggers fire: a session with
// session_replication_role = replica (logical replication's apply worker,
// pg_restore --disable-triggers, pgloader) or a table whose triggers were
// disabled (ALTER TABLE … DISABLE TRIGGER ALL) inserts rows the queue never
// hears of. The leader finds them: a row in the outbox that is neither
// queued (onceflow.outbox_pending) nor in the publish log
// (onceflow.outbox_published) was never queued (a published row is in the
// log until the row itself is pruned; a skipped or deleted row is gone). It
// queues such rows, counts them and logs them, and publishes them like any
// other.
//
// Two walks, each bounded:
//   - the tail, before every poll that finds rows (and once a second when
//     idle), in the poll's own snapshot: the ids above
//     the highest id it saw the time before, less sweepMargin. A later row
//     of a source is only visible once the source's earlier rows committed
//     (a source's writers serialize on its counter), so a row found here is
//     queued before the poll that could see its successors, and goes first
//     (queue order is id order): per-source order holds for every unqueued
//     row whose transaction ends before sweepMargin newer ids are visible;
//   - the full walk, sweepChunk ids every sweepFullInterval, from the lowest
//     id to the highest and round again: it finds what the tail missed (a
//     transaction that stayed open longer, rows written before this leader
//     started). A row it finds may come after later rows of its source that
//     were already published: it is still published (never lost), and the
//     relay logs it at ERROR as out of order.
const (
	sweepMargin       = 1000
	sweepChunk        = 5000
	sweepFullInterval = time.Second
	sweepIdleInterval = time.Second
)

// sweeper is a leader session's sweep state.
type sweeper struct {
	tailFrom int64     // the tail walks ids above this; -1: not yet known
	tailAt   time.Time // the last tail sweep
	busy     bool      // the last poll found rows
	fullFrom int64     // the full walk's next step starts above this
	fullAt   time.Time
}

func newSweeper() *sweeper { return &sweeper{tailFrom: -1} }

// sweepResult is what one sweep statement did.
type sweepResult struct {
	found, minID, maxID, outOfOrder, maxSeen int64
}

// sweepRange queues the unqueued rows of this relay's shard with ids in
// (lo, hi].
func (r *Relay) sweepRange(ctx context.Context, q pgx.Tx, lo, hi int64) (sweepResult, error) {
	var res sweepResult
	sql, args := r.sharded(qSweep, qSweepShard, lo, hi)
	err := q.QueryRow(ctx, sql, args...).Scan(&res.found, &res.minID, &res.maxID, &res.outOfOrder, &res.maxSeen)
	return res, err
}

// sweepAndFetch reads the next batch after sweeping: the tail always, a
// full-walk step when due, both in the batch's REPEATABLE READ snapshot, so
// that the batch holds no row the sweep could not see. An idle relay (the
// last poll found nothing) first polls alone, and sweeps only when that
// poll finds rows or sweepIdleInterval has passed: its idle polls stay one
// statement.
func (s *leaderSession) sweepAndFetch(ctx context.Context, exclude []int64) ([]row, error) {
	r := s.r
	sw := s.sweep
	now := time.Now()
	if !sw.busy && now.Sub(sw.tailAt) < sweepIdleInterval {
		rows, err := r.fetch(ctx, r.cfg.DB, exclude)
		if err != nil || len(rows) == 0 {
			return rows, err
		}
	}
	var rows []row
	err := pgx.BeginTxFunc(ctx, r.cfg.DB, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		t0 := time.Now()
		if sw.tailFrom < 0 {
			// The first sweep of a tenure starts the tail just below the
			// newest id; the full walk covers the rest.
			var top int64
			if err := tx.QueryRow(ctx, qOutboxMaxID).Scan(&top); err != nil {
				return fmt.Errorf("sweep: read the newest outbox id: %w", err)
			}
			sw.tailFrom = max(0, top-sweepMargin)
		}
		tail, err := r.sweepRange(ctx, tx, sw.tailFrom, math.MaxInt64-1) // -1: int8range(…, '(]') adds one
		if err != nil {
			return fmt.Errorf("sweep for unqueued rows: %w", err)
		}
		s.reportSweep(ctx, "tail", tail)
		if now.Sub(sw.fullAt) >= sweepFullInterval {
			sw.fullAt = now
			if sw.fullFrom >= tail.maxSeen {
				sw.fullFrom = 0
			}
			full, err := r.sweepRange(ctx, tx, sw.fullFrom, sw.fullFrom+sweepChunk)
			if err != nil {
				return fmt.Errorf("sweep for unqueued rows: %w", err)
			}
			s.reportSweep(ctx, "full", full)
			sw.fullFrom += sweepChunk
		}
		r.m.sweepDuration.Observe(time.Since(t0).Seconds())
		rows, err = r.fetch(ctx, tx, exclude)
		if err != nil {
			return err
		}
		sw.tailFrom = max(sw.tailFrom, tail.maxSeen-sweepMargin)
		sw.tailAt = now
		return nil
	})
	sw.busy = err == nil && len(rows) > 0
	return rows, err
}

// reportSweep counts and logs what a sweep found.
func (s *leaderSession) reportSweep(ctx context.Context, walk string, res sweepResult) {
	if res.found == 0 {
		return
	}
	s.r.m.unqueued.Add(float64(res.found))
	attrs := []any{slog.String("walk", walk), slog.Int64("rows", res.found), slog.Int64("first_id", res.minID), slog.Int64("last_id", res.maxID)}
	if res.outOfOrder > 0 {
		s.log.ErrorContext(ctx, "found outbox rows that were never queued (written while the outbox's triggers did not fire) "+
			"after later rows of their sources: queued, they are published, but after those rows (docs/runbooks/RelayUnqueuedRows.md)",
			append(attrs, slog.Int64("out_of_order", res.outOfOrder))...)
		return
	}
	s.log.WarnContext(ctx, "found outbox rows that were never queued (written while the outbox's triggers did not fire): queued for publishing "+
		"(docs/runbooks/RelayUnqueuedRows.md)", attrs...)
}
