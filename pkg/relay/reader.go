package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"slices"
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
//   - the tail, after every poll that finds rows (and once a second when
//     idle), in the poll's own snapshot: the ids above the highest id it
//     covered the time before, less sweepMargin, up to the batch's last id
//     (every id when the poll found nothing). A later row of a source is
//     only visible once the source's earlier rows committed (a source's
//     writers serialize on its counter), so a row found here is queued in
//     the snapshot of the batch that could hold its successors, and the
//     poll runs again and takes it first (queue order is id order):
//     per-source order holds for every unqueued row whose transaction ends
//     before sweepMargin newer ids are visible;
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

// The scan floor. The poll walks onceflow.outbox_pending in id order, and an
// entry deleted (its row published) while some snapshot is open stays in
// the index until vacuum may remove it: a poll starting at the lowest id
// would visit every entry published since the oldest open snapshot. So the
// poll starts above the floor, an id at or below which nothing is pending
// and nothing can become pending again (docs/relay.md, "How the poll stays
// cheap under old snapshots").
//
// The floor rises by marks (migration 024): a mark is the highest id drawn
// so far (M) and an xid (X) above that of every transaction that drew one
// of those ids, each drawn by a transaction that had its xid already. Once
// no transaction of this database with an xid below X is still running
// (sessions and prepared transactions; only they can insert into this
// outbox), every row with id <= M is committed and visible in any later
// snapshot, or never will be; so the floor may rise to M, or to just below
// the lowest id pending in that snapshot if that is lower (a row of a
// held-back source, a batch being marked). A read-only snapshot (a report,
// a standby's hot_standby_feedback, a replication slot) has no xid and
// never holds the floor, nor does a writer in another database of the same
// server. A writing transaction of this database open for long does (it may
// still commit a low id): the floor waits for it, and the walk grows with
// what is published meanwhile.
//
// Nothing else may leave a pending id below the floor, and two things can:
// the sweep queues rows of old ids (it lowers the floor to the lowest it
// queued), and a row whose id was not drawn by the sequence in a
// transaction with an xid (an INSERT … OVERRIDING SYSTEM VALUE naming its
// id, or one naming its seqs without onceflow.next_seqs in a transaction
// that had not written yet). The full walk's step also looks for pending
// ids below the floor in its chunk and lowers the floor to them, so such a
// row is found within one round of the full walk, like an unqueued one
// (after later rows of its source, if any were published meanwhile). A
// new term (leader change, shard) starts at floor 0: one full walk.

// reader reads a term's batches and sweeps for unqueued rows. A publisher
// owns it; its sweep state and scan floor last the term.
type reader struct {
	cfg Config
	lay layout
	m   *metrics
	log *slog.Logger

	tailFrom int64     // the tail walks ids above this; -1: not yet known
	tailAt   time.Time // the last tail sweep
	busy     bool      // the last poll found rows
	fullFrom int64     // the full walk's next step starts above this
	fullAt   time.Time

	floor   int64     // the poll walks pending ids above this
	mark    scanMark  // what the floor rises by next
	floorAt time.Time // the last attempt to raise the floor
}

// scanMark is a mark the floor rises by: once no transaction of this
// database older than xid runs, every row with an id up to lastID is
// visible to a new snapshot or never will be.
type scanMark struct {
	lastID, xid int64
	ok          bool
}

// lower brings the floor below id, a pending id found at or below it.
func (rd *reader) lower(id int64) {
	if id > 0 && id <= rd.floor {
		rd.floor = id - 1
	}
}

// raiseOrLog is raise for the poll: a failure leaves the floor where it is
// (the polls stay correct, only not cheaper) and is logged.
func (rd *reader) raiseOrLog(ctx context.Context) {
	if err := rd.raise(ctx); err != nil && ctx.Err() == nil {
		rd.log.WarnContext(ctx, "the relay's scan floor did not rise", slog.Any("error", err))
	}
}

// raise moves the floor up when the mark is settled (see "The scan floor")
// and takes the next mark. It runs after a poll, outside its snapshot.
func (rd *reader) raise(ctx context.Context) error {
	rd.floorAt = time.Now()
	if rd.mark.ok {
		// First the writers, then, in a later snapshot, the queue
		// (qScanOldest says why).
		var oldest, low int64
		if err := rd.cfg.DB.QueryRow(ctx, qScanOldest).Scan(&oldest); err != nil {
			return fmt.Errorf("scan floor: read the oldest running xid: %w", err)
		}
		if oldest < rd.mark.xid {
			return nil // a transaction of this database that may yet commit an id <= mark.lastID is still running
		}
		if err := rd.cfg.DB.QueryRow(ctx, qScanLowest, rd.floor).Scan(&low); err != nil {
			return fmt.Errorf("scan floor: read the lowest pending id: %w", err)
		}
		to := rd.mark.lastID
		if low > 0 {
			to = min(to, low-1)
		}
		rd.floor = max(rd.floor, to)
		rd.m.scanFloor.Set(float64(rd.floor))
	}
	if err := rd.cfg.DB.QueryRow(ctx, qScanMark).Scan(&rd.mark.lastID, &rd.mark.xid); err != nil {
		rd.mark.ok = false
		return fmt.Errorf("scan floor: take a mark: %w", err)
	}
	rd.mark.ok = true
	return nil
}

func newReader(cfg Config, lay layout, m *metrics, log *slog.Logger) *reader {
	return &reader{cfg: cfg, lay: lay, m: m, log: log, tailFrom: -1}
}

// sweepResult is what one sweep statement did.
type sweepResult struct {
	found, minID, maxID, outOfOrder, maxSeen int64
}

// sweepRange queues the unqueued rows of this relay's shard with ids in
// (lo, hi].
func (rd *reader) sweepRange(ctx context.Context, q pgx.Tx, lo, hi int64) (sweepResult, error) {
	var res sweepResult
	sql, args := rd.lay.sharded(qSweep, qSweepShard, lo, hi)
	err := q.QueryRow(ctx, sql, args...).Scan(&res.found, &res.minID, &res.maxID, &res.outOfOrder, &res.maxSeen)
	return res, err
}

// next reads the next batch and sweeps for unqueued rows, both in the
// batch's REPEATABLE READ snapshot, so that the batch holds no row the sweep
// could not see: a full-walk step when due, the poll, then the tail up to
// the batch's last id (every id when the poll found nothing), and the poll
// again when the tail queued rows (they may come before the batch's). An
// idle relay (the last poll found nothing) first polls alone, and sweeps
// only when that poll finds rows or sweepIdleInterval has passed: its idle
// polls stay one statement.
//
// The tail stops at the batch's last id because only rows up to it can go
// out of order by this batch: a row above it is swept before a later batch
// reaches it. A transaction that queues a million rows at once so costs the
// next sweep a batch's worth of probes, not a million.
func (rd *reader) next(ctx context.Context, exclude []int64) ([]row, error) {
	now := time.Now()
	if !rd.busy && now.Sub(rd.tailAt) < sweepIdleInterval {
		rows, err := rd.fetchAlone(ctx, exclude)
		if err == nil && now.Sub(rd.floorAt) >= sweepIdleInterval {
			rd.raiseOrLog(ctx)
		}
		if err != nil || len(rows) == 0 {
			return rows, err
		}
	}
	var rows []row
	err := pgx.BeginTxFunc(ctx, rd.cfg.DB, pgx.TxOptions{BeginQuery: qBeginWalk}, func(tx pgx.Tx) error {
		t0 := time.Now()
		if rd.tailFrom < 0 {
			// The first sweep of a tenure starts the tail just below the
			// newest id; the full walk covers the rest.
			var top int64
			if err := tx.QueryRow(ctx, qOutboxMaxID).Scan(&top); err != nil {
				return fmt.Errorf("sweep: read the newest outbox id: %w", err)
			}
			rd.tailFrom = max(0, top-sweepMargin)
		}
		if now.Sub(rd.fullAt) >= sweepFullInterval {
			if err := rd.fullStep(ctx, tx, now); err != nil {
				return err
			}
		}
		sweeping := time.Since(t0)
		var err error
		if rows, err = rd.fetch(ctx, tx, exclude); err != nil {
			return err
		}
		t1 := time.Now()
		hi := int64(math.MaxInt64 - 1) // -1: int8range(…, '(]') adds one
		if len(rows) > 0 {
			hi = rows[len(rows)-1].id
		}
		var tail sweepResult
		if hi > rd.tailFrom { // else the batch lies below the tail (late commits): nothing new to cover
			if tail, err = rd.sweepRange(ctx, tx, rd.tailFrom, hi); err != nil {
				return fmt.Errorf("sweep for unqueued rows: %w", err)
			}
			rd.report(ctx, "tail", tail)
		}
		rd.m.sweepDuration.Observe((sweeping + time.Since(t1)).Seconds())
		if tail.found > 0 {
			rd.lower(tail.minID)
			if rows, err = rd.fetch(ctx, tx, exclude); err != nil {
				return err
			}
		}
		if hi > rd.tailFrom {
			rd.tailFrom = max(rd.tailFrom, min(hi, tail.maxSeen)-sweepMargin)
		}
		rd.tailAt = now
		return nil
	})
	rd.busy = err == nil && len(rows) > 0
	if rd.busy {
		rd.raiseOrLog(ctx)
	}
	return rows, err
}

// fullStep is one step of the full walk: sweepChunk ids above fullFrom,
// and a look for pending ids below the floor in them.
func (rd *reader) fullStep(ctx context.Context, tx pgx.Tx, now time.Time) error {
	rd.fullAt = now
	full, err := rd.sweepRange(ctx, tx, rd.fullFrom, rd.fullFrom+sweepChunk)
	if err != nil {
		return fmt.Errorf("sweep for unqueued rows: %w", err)
	}
	rd.report(ctx, "full", full)
	if full.found > 0 {
		rd.lower(full.minID)
	}
	if rd.fullFrom < rd.floor {
		var low int64
		if err := tx.QueryRow(ctx, qPendingBelow, rd.fullFrom, min(rd.fullFrom+sweepChunk, rd.floor)).Scan(&low); err != nil {
			return fmt.Errorf("scan floor: look for pending ids below it: %w", err)
		}
		if low > 0 {
			rd.log.WarnContext(ctx, "found a pending outbox row below the relay's scan floor (its id was not drawn by a transaction "+
				"that had its xid, or it was queued by hand): lowering the floor to publish it", slog.Int64("id", low), slog.Int64("floor", rd.floor))
			rd.lower(low)
		}
	}
	rd.fullFrom += sweepChunk
	if full.maxSeen > 0 && rd.fullFrom >= full.maxSeen {
		rd.fullFrom = 0 // the full walk goes round again
	}
	return nil
}

// report counts and logs what a sweep found.
func (rd *reader) report(ctx context.Context, walk string, res sweepResult) {
	if res.found == 0 {
		return
	}
	rd.m.unqueued.Add(float64(res.found))
	attrs := []any{slog.String("walk", walk), slog.Int64("rows", res.found), slog.Int64("first_id", res.minID), slog.Int64("last_id", res.maxID)}
	if res.outOfOrder > 0 {
		rd.log.ErrorContext(ctx, "found outbox rows that were never queued (written while the outbox's triggers did not fire) "+
			"after later rows of their sources: queued, they are published, but after those rows (docs/runbooks/RelayUnqueuedRows.md)",
			append(attrs, slog.Int64("out_of_order", res.outOfOrder))...)
		return
	}
	rd.log.WarnContext(ctx, "found outbox rows that were never queued (written while the outbox's triggers did not fire): queued for publishing "+
		"(docs/runbooks/RelayUnqueuedRows.md)", attrs...)
}

// row is an outbox row as a batch holds it.
type row struct {
	id          int64
	eventID     string
	topic       string
	source      string
	seq         int64
	eventType   string
	contentType string
	key         []byte
	headers     map[string]string
	payload     []byte
	fp          uint32 // fingerprint(eventID)
	retrying    bool   // a set-aside row being tried again
	// size is what the row weighs against BatchMaxBytes (rowSize). A row
	// over it is read without its payload, key and headers, and with its
	// names cut: it is set aside unread (oversized).
	size      int64
	oversized bool
}

// fetch reads the next batch, bounded by BatchMaxRows and BatchMaxBytes:
// the statement measures each row before reading it, so the relay never
// holds more than BatchMaxBytes of rows, whatever a row's size (a row over
// it comes without its values: oversized).
// Its transaction must have the planner settings of qBeginWalk.
func (rd *reader) fetch(ctx context.Context, tx pgx.Tx, exclude []int64) ([]row, error) {
	q, args := rd.poll(exclude)
	rs, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return rd.scan(rs)
}

// fetchAlone is fetch outside a transaction: the poll goes in one batch
// after qIndexPlans, so one round trip.
func (rd *reader) fetchAlone(ctx context.Context, exclude []int64) ([]row, error) {
	b := &pgx.Batch{}
	b.Queue(qIndexPlans)
	q, args := rd.poll(exclude)
	b.Queue(q, args...)
	br := rd.cfg.DB.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("poll: planner settings: %w", err)
	}
	rs, err := br.Query()
	if err != nil {
		return nil, err
	}
	return rd.scan(rs)
}

// poll is the poll statement and its arguments.
func (rd *reader) poll(exclude []int64) (string, []any) {
	if exclude == nil {
		exclude = []int64{}
	}
	return rd.lay.sharded(qSelectBatch, qSelectBatchShard, rd.cfg.BatchMaxRows, exclude, int64(rd.cfg.BatchMaxBytes), rd.floor)
}

// scan reads a poll's rows, in id order, and ends the batch at the byte
// budget.
func (rd *reader) scan(rs pgx.Rows) ([]row, error) {
	budget := int64(rd.cfg.BatchMaxBytes)
	defer rs.Close()
	var out []row
	for rs.Next() {
		var w row
		var hs []byte
		if err := rs.Scan(&w.id, &w.eventID, &w.topic, &w.source, &w.seq, &w.eventType, &w.contentType, &w.key, &hs, &w.payload, &w.retrying, &w.size); err != nil {
			return nil, err
		}
		w.fp = fingerprint(w.eventID)
		if w.size > budget {
			w.oversized = true
			out = append(out, w)
			continue
		}
		if len(hs) > 2 {
			if err := json.Unmarshal(hs, &w.headers); err != nil {
				return nil, fmt.Errorf("outbox row %d: headers: %w", w.id, err)
			}
		}
		out = append(out, w)
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b row) int { return cmp.Compare(a.id, b.id) })
	// The statement ends the batch at the budget already.
	var bytes int64
	for i, w := range out {
		if !w.oversized {
			bytes += w.size
		}
		if i > 0 && bytes > budget {
			return out[:i], nil
		}
	}
	return out, nil
}
