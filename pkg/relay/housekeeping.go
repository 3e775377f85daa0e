package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// housekeeper does a leader's chores beside the publisher: it keeps the
// backlog metrics, prunes published rows, and turns the outbox's
// notifications into wake-ups of the poll loop. It holds no state of its
// own; its loops run for a term.
type housekeeper struct {
	cfg Config
	log *slog.Logger
	m   *metrics
	lay layout
}

// run runs the chores until held is cancelled (the term ends).
func (h *housekeeper) run(held context.Context, wake chan<- struct{}, log *slog.Logger) {
	var wg sync.WaitGroup
	if h.cfg.Listen {
		wg.Add(1)
		go func() { defer wg.Done(); h.listen(held, wake, log) }()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		h.every(held, func(took time.Duration) time.Duration { return statsWait(h.cfg.StatsInterval, took) }, h.stats)
	}()
	go func() {
		defer wg.Done()
		h.every(held, func(took time.Duration) time.Duration { return max(0, h.cfg.PruneInterval-took) }, h.prune)
	}()
	wg.Wait()
}

// statsSpacing is how many times as long as the last refresh of the
// gauges the next one waits, at least: counting the queue reads every
// pending row, and with a backlog of millions (after an outage, when the
// relay is needed most) a refresh every StatsInterval took one of two
// cores from the publisher (measured: 1.6-3.8 s per refresh of a 2.7M-row
// backlog, every 2 s, the drain at about 1,300 rows/s). Paced, the
// refreshes take at most a tenth of one backend's time.
const statsSpacing = 10

// statsWait is how long the gauges' next refresh waits after one that
// took took.
func statsWait(interval, took time.Duration) time.Duration {
	return max(interval, statsSpacing*took)
}

// listen turns notifications on notifyChannel into wake-ups of the poll
// loop, reconnecting with backoff. It is only ever a hint.
func (h *housekeeper) listen(ctx context.Context, wake chan<- struct{}, log *slog.Logger) {
	bo := newBackoff(h.cfg.BackoffMax)
	for ctx.Err() == nil {
		err := func() error {
			conn, err := h.cfg.DB.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
				return err
			}
			defer func() {
				// Leave the pooled connection as we found it.
				uctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if _, err := conn.Exec(uctx, "UNLISTEN "+notifyChannel); err != nil {
					conn.Conn().Close(uctx) //nolint:errcheck
				}
			}()
			bo.Reset()
			for {
				if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
					return err
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}()
		if ctx.Err() != nil {
			return
		}
		h.m.errors.WithLabelValues(errKindPostgres).Inc()
		log.WarnContext(ctx, "listen for outbox notifications", slog.Any("error", err))
		_ = sleep(ctx, bo.NextBackOff())
	}
}

// every runs f, then waits what wait says for the time f took, until ctx
// ends.
func (h *housekeeper) every(ctx context.Context, wait func(took time.Duration) time.Duration, f func(context.Context) error) {
	for {
		t0 := time.Now()
		if err := f(ctx); err != nil && ctx.Err() == nil {
			h.m.errors.WithLabelValues(errKindPostgres).Inc()
			h.log.WarnContext(ctx, "relay housekeeping", slog.Any("error", err))
		}
		t := time.NewTimer(wait(time.Since(t0)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (h *housekeeper) stats(ctx context.Context) error {
	var n, held, open int64
	var age float64
	q, args := h.lay.sharded(qStats, qStatsShard)
	// One backend, no parallel workers: the count of a large backlog
	// would otherwise take two more cores from the publisher for its
	// duration (statsSpacing paces by that duration).
	err := pgx.BeginFunc(ctx, h.cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qStatsSerial); err != nil {
			return err
		}
		return tx.QueryRow(ctx, q, args...).Scan(&n, &held, &age, &open)
	})
	if err != nil {
		return fmt.Errorf("count pending rows: %w", err)
	}
	h.m.pending.Set(float64(n))
	h.m.held.Set(float64(held))
	h.m.oldestAge.Set(age)
	h.m.setAside.Set(float64(open))
	if h.cfg.Shards > 1 {
		// A shard nobody runs publishes nothing and its lag shows nowhere
		// else: every leader reports it.
		var leaderless int64
		if err := h.cfg.DB.QueryRow(ctx, qLeaderlessShards, h.cfg.Shards).Scan(&leaderless); err != nil {
			return fmt.Errorf("count shards without leader: %w", err)
		}
		h.m.leaderless.Set(float64(leaderless))
	}
	return nil
}

// prune deletes published rows older than the retention, whole publish
// batches at a time (about PruneBatchRows rows per statement), at most 100
// statements per call so that it yields to the publisher's connection use;
// under steady load it keeps up as long as one call deletes more than
// PruneInterval's worth of published rows. Every shard's leader prunes
// whichever batches are due (a batch another is pruning is skipped).
//
// First it keeps the outbox's partitions (partitions): the rows of an
// id-range partition go with it, a TRUNCATE and a DROP, not row by row.
func (h *housekeeper) prune(ctx context.Context) error {
	retention := max(h.cfg.Retention, 0).Seconds()
	if err := h.partitions(ctx, retention); err != nil {
		return err
	}
	for range 100 {
		var rows, batches int64
		if err := h.cfg.DB.QueryRow(ctx, qPrune, retention, h.cfg.PruneBatchRows).Scan(&rows, &batches); err != nil {
			return fmt.Errorf("prune outbox: %w", err)
		}
		h.m.pruned.Add(float64(rows))
		if batches == 0 {
			return nil
		}
	}
	return nil
}

// partitions makes the outbox's partitions ahead of its ids (and the
// publish log's partition of each range with it), empties the partitions
// whose rows are all published and older than the retention (retention
// seconds), drops the emptied ones, and then drops the publish log's
// partitions whose batches may all go (logPartitions). Each step waits at
// most 100 ms for its lock (SQLSTATE 55P03 then): a partition it could not
// lock is left for the next pass.
func (h *housekeeper) partitions(ctx context.Context, retention float64) error {
	if _, err := h.cfg.DB.Exec(ctx, qEnsurePartitions); err != nil && !lockTimeout(err) {
		return fmt.Errorf("make outbox partitions: %w", err)
	}
	due, err := h.partitionList(ctx, qPartitionsDue)
	if err != nil {
		return err
	}
	for _, from := range due {
		var rows *int64
		if err := h.cfg.DB.QueryRow(ctx, qExpirePartition, from, retention).Scan(&rows); err != nil {
			if lockTimeout(err) {
				continue
			}
			return fmt.Errorf("expire outbox partition from id %d: %w", from, err)
		}
		if rows != nil {
			h.m.pruned.Add(float64(*rows))
			h.log.InfoContext(ctx, "outbox partition emptied", slog.Int64("from_id", from), slog.Int64("rows", *rows))
		}
	}
	emptied, err := h.partitionList(ctx, qPartitionsTruncated)
	if err != nil {
		return err
	}
	for _, from := range emptied {
		if _, err := h.cfg.DB.Exec(ctx, qDropPartition, from); err != nil && !lockTimeout(err) {
			return fmt.Errorf("drop outbox partition from id %d: %w", from, err)
		}
	}
	return h.logPartitions(ctx, retention)
}

// logPartitions drops the publish log's partitions whose batches may all
// go (qDropLogPartitions), a DROP each, never a DELETE. One call drops
// every one that is due; it takes its lock only when one is.
func (h *housekeeper) logPartitions(ctx context.Context, retention float64) error {
	type dropped struct{ From, Batches int64 }
	rows, err := h.cfg.DB.Query(ctx, qDropLogPartitions, retention)
	var gone []dropped
	if err == nil {
		gone, err = pgx.CollectRows(rows, pgx.RowToStructByPos[dropped])
	}
	if err != nil {
		if lockTimeout(err) {
			return nil
		}
		return fmt.Errorf("drop publish-log partitions: %w", err)
	}
	for _, d := range gone {
		h.log.InfoContext(ctx, "publish-log partition dropped", slog.Int64("from_last_id", d.From), slog.Int64("batches", d.Batches))
	}
	return nil
}

// partitionList runs q, a list of partitions' first ids.
func (h *housekeeper) partitionList(ctx context.Context, q string) ([]int64, error) {
	rows, err := h.cfg.DB.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("list outbox partitions: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("list outbox partitions: %w", err)
	}
	return ids, nil
}

// lockTimeout reports whether err is a lock wait that ran out (SQLSTATE
// 55P03).
func lockTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// reserveTopics registers the relay's checkpoint topic as reserved, so that
// the database refuses events for it from every producer. A database
// without onceflow.reserve_topic (not yet migrated) or a role without
// EXECUTE on it is logged and tolerated: the relay still refuses such rows
// itself (reservedRow).
func (h *housekeeper) reserveTopics(ctx context.Context) {
	if _, err := h.cfg.DB.Exec(ctx, qReserveTopic, h.cfg.CheckpointTopic, "relay checkpoints"); err != nil && ctx.Err() == nil {
		var pe *pgconn.PgError
		hint := ""
		if errors.As(err, &pe) && (pe.Code == "42883" || pe.Code == "42501") {
			hint = "run the migrations and deploy/sql/roles.sql: the database cannot refuse producers' events for the checkpoint topic until then"
		}
		h.log.WarnContext(ctx, "register the checkpoint topic as reserved", slog.String("topic", h.cfg.CheckpointTopic),
			slog.Any("error", err), slog.String("fix", hint))
	}
}
