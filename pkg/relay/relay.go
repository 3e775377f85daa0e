package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/dbtx"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/relay/internal/identity"
	"github.com/onceflow/onceflow/pkg/schema"
)

// maxSetAsideRetry caps the automatic retry interval of set-aside rows.
const maxSetAsideRetry = 10 * time.Minute

// Relay publishes the outbox to Kafka. Several relays may run against one
// database: the one holding the shard's lease publishes, the others stand by.
type Relay struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	start time.Time

	// shardIndex is Shard's index with Shards > 1; ownSource reports
	// whether a source belongs to it (nil with one shard: every source
	// does).
	shardIndex int
	ownSource  func(source string) bool

	// Bound by recover (leader loop only): the database identity, the
	// transactional.id and checkpoint key derived from it, and whether the
	// shard's legacy checkpoint is settled.
	identity      string
	txnID         string
	ckptKey       string
	legacySettled bool

	leader     atomic.Bool
	validUntil atomic.Int64 // lease deadline, nanoseconds since start (monotonic)
	readyErr   atomic.Pointer[error]

	// checked holds the topics Config.TopicCheck accepted (leader loop only).
	checked map[string]bool

	tracer trace.Tracer
	// recovered is the last recovery, for the next transaction's span
	// (leader loop only).
	recovered *recovery
}

// New checks cfg (after WithDefaults) and registers the metrics.
func New(cfg Config) (*Relay, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register relay metrics: %w", err)
	}
	r := &Relay{
		cfg:    cfg,
		log:    cfg.Logger.With(slog.String("shard", cfg.Shard), slog.String("holder", cfg.HolderID)),
		m:      m,
		start:  time.Now(),
		tracer: tracer(cfg.TracerProvider),
	}
	if cfg.Shards > 1 {
		r.shardIndex, _ = strconv.Atoi(cfg.Shard) // validated
		r.log = r.log.With(slog.Int("shards", cfg.Shards))
		r.ownSource = func(source string) bool { return SourceShard(source, cfg.Shards) == r.shardIndex }
	}
	return r, nil
}

// IsLeader reports whether this relay holds its shard's lease.
func (r *Relay) IsLeader() bool { return r.leader.Load() }

// Role is "leader" or "standby".
func (r *Relay) Role() string {
	if r.IsLeader() {
		return "leader"
	}
	return "standby"
}

// Ready is nil while the relay can reach PostgreSQL, whether it leads or
// stands by: a standby is ready because it is doing its job (waiting to take
// over), and marking it unready would block rolling updates for nothing.
func (r *Relay) Ready() error {
	if p := r.readyErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (r *Relay) setReady(err error) {
	if err == nil {
		r.readyErr.Store(nil)
		return
	}
	r.readyErr.Store(&err)
}

// Run takes part in leader election and publishes while leading. It returns
// nil once ctx is cancelled and the in-flight batch is committed (or aborted)
// and the lease released. It returns an *IdentityError, after releasing the
// lease, when it cannot prove that the database or a checkpoint is its own:
// publishing on would risk marking rows that were never published.
func (r *Relay) Run(ctx context.Context) error {
	if r.cfg.Shards > 1 {
		var enc string
		if err := r.retry(ctx, errKindPostgres, "read the database encoding", func() error {
			return r.cfg.DB.QueryRow(ctx, qServerEncoding).Scan(&enc)
		}); err != nil {
			return nil // ctx cancelled
		}
		// onceflow.source_shard hashes the database's bytes of a source,
		// SourceShard its UTF-8 bytes: they agree only where the two are
		// the same.
		if enc != "UTF8" && enc != "SQL_ASCII" {
			err := &ConfigError{Field: "Shards", Reason: fmt.Sprintf("must be 1 on a database whose encoding is %s: "+
				"onceflow.source_shard hashes a source's bytes in that encoding and SourceShard its UTF-8 bytes, "+
				"so a source with a non-ASCII character would belong to two shards, or none (docs/relay.md, \"Shards\")", enc)}
			r.log.ErrorContext(ctx, "relay stopped: "+err.Error())
			return err
		}
	}
	if err := schema.WaitReady(ctx, r.cfg.DB, func(err error, wait time.Duration) {
		r.m.errors.WithLabelValues(errKindPostgres).Inc()
		r.log.ErrorContext(ctx, "check schema", slog.Any("error", err), slog.Duration("retry_in", wait))
	}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if err := r.retry(ctx, errKindKafka, "ensure checkpoint topic", func() error {
		cl, err := kgo.NewClient(r.cfg.KafkaOpts...)
		if err != nil {
			return err
		}
		defer cl.Close()
		return ensureCheckpointTopic(ctx, cl, r.cfg.CheckpointTopic)
	}); err != nil {
		return nil // ctx cancelled
	}
	r.reserveTopics(ctx)
	for {
		var ie *IdentityError
		epoch, err := r.acquire(ctx)
		switch {
		case err == nil:
			err = r.lead(ctx, epoch)
		case !errors.As(err, &ie):
			return nil // ctx cancelled
		}
		if errors.As(err, &ie) {
			r.log.ErrorContext(ctx, "relay stopped: "+ie.Problem, slog.String("fix", ie.Fix))
			return err
		}
		if ctx.Err() != nil {
			r.log.InfoContext(ctx, "relay stopped")
			return nil
		}
		r.log.WarnContext(ctx, "leadership ended, standing by", slog.Any("error", err))
	}
}

// acquire waits until this relay holds the lease and returns its epoch. It
// fails when ctx ends, or with an *IdentityError from settling another
// shard count's leases.
func (r *Relay) acquire(ctx context.Context) (int64, error) {
	logged, layoutLogged := false, ""
	for {
		t0 := time.Since(r.start)
		qctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL)
		epoch, others, err := r.tryAcquire(qctx)
		cancel()
		switch {
		case err == nil && len(others) == 0:
			r.setReady(nil)
			r.m.layoutConflict.Set(0)
			r.validUntil.Store(int64(t0 + r.cfg.LeaseTTL))
			return epoch, nil
		case err == nil && others.live():
			// Another layout leads: this relay waits, ready (a rolling
			// update replacing those relays must go on), counted in
			// onceflow_relay_layout_conflict.
			r.setReady(nil)
			r.m.layoutConflict.Set(1)
			if desc := others.String(); desc != layoutLogged {
				r.m.errors.WithLabelValues(errKindLease).Inc()
				if others.sameCount(r.cfg.Shards) {
					r.log.ErrorContext(ctx, "standing by: a relay with another -shard name leads this database; "+
						"this relay takes no lease until it stops (with -shards 1 a database has one leader, "+
						"so every relay of it must run with the same -shard: set -shard, or ONCEFLOW_SHARD, alike on all of them)",
						slog.String("leases", desc))
				} else {
					r.log.ErrorContext(ctx, "standing by: relays with another shard count hold leases; "+
						"this relay takes none until they stop (every relay of a database must run with the same -shards)",
						slog.Int("shards", r.cfg.Shards), slog.String("leases", desc))
				}
				layoutLogged = desc
			}
			if err := sleep(ctx, r.cfg.StandbyInterval); err != nil {
				return 0, err
			}
			continue
		case err == nil:
			// Only expired leases of another count: settle their last
			// checkpoints, then try again at once.
			err = r.settleLayout(ctx)
			var ie *IdentityError
			switch {
			case err == nil:
				continue
			case errors.As(err, &ie):
				return 0, err
			case ctx.Err() != nil:
				return 0, ctx.Err()
			}
			r.m.errors.WithLabelValues(errKindCheckpoint).Inc()
			r.log.WarnContext(ctx, "settle the leases of another shard count", slog.Any("error", err))
		case errors.Is(err, errLeaseLockBusy):
			// Another relay is taking a lease (milliseconds) or settling
			// another shard count (seconds): try again soon.
			if err := sleep(ctx, r.cfg.StandbyInterval/10); err != nil {
				return 0, err
			}
			continue
		case errors.Is(err, pgx.ErrNoRows):
			r.setReady(nil)
			r.m.layoutConflict.Set(0)
			if !logged {
				r.log.InfoContext(ctx, "standing by: another relay holds the lease")
				logged = true
			}
		case ctx.Err() != nil:
			return 0, ctx.Err()
		default:
			r.setReady(fmt.Errorf("take lease: %w", err))
			r.m.errors.WithLabelValues(errKindLease).Inc()
			r.log.WarnContext(ctx, "take lease", slog.Any("error", err))
		}
		if err := sleep(ctx, r.cfg.StandbyInterval); err != nil {
			return 0, err
		}
	}
}

// tryAcquire takes the shard's lease unless another relay holds it
// (pgx.ErrNoRows), another relay holds the lease lock (errLeaseLockBusy), or
// leases of another shard count exist (returned, no lease taken). The
// advisory lock makes the check and the take one step among relays.
func (r *Relay) tryAcquire(ctx context.Context) (epoch int64, others otherLeases, err error) {
	err = pgx.BeginFunc(ctx, r.cfg.DB, func(tx pgx.Tx) error {
		var locked bool
		if err := tx.QueryRow(ctx, qLeaseTryLock).Scan(&locked); err != nil {
			return err
		}
		if !locked {
			return errLeaseLockBusy
		}
		if others, err = readOtherLeases(ctx, tx, r.cfg.Shards, r.cfg.Shard); err != nil || len(others) > 0 {
			return err
		}
		return tx.QueryRow(ctx, qAcquireLease, r.cfg.Shard, r.cfg.HolderID, r.cfg.LeaseTTL.Seconds(), r.cfg.Shards).Scan(&epoch)
	})
	return epoch, others, err
}

// errLeaseLockBusy: another relay holds the lease lock.
var errLeaseLockBusy = errors.New("lease lock busy")

// otherLease is a lease taken by a relay with another shard count.
type otherLease struct {
	shard  string
	shards int
	holder string
	live   bool
}

type otherLeases []otherLease

func (ls otherLeases) live() bool {
	return slices.ContainsFunc(ls, func(l otherLease) bool { return l.live })
}

func (ls otherLeases) String() string {
	var b strings.Builder
	for i, l := range ls {
		if i > 0 {
			b.WriteString(", ")
		}
		state := "expired"
		if l.live {
			state = "held by " + l.holder
		}
		fmt.Fprintf(&b, "shard %q of %d (%s)", l.shard, l.shards, state)
	}
	return b.String()
}

// sameCount reports whether a lease is of shard count shards (with one
// shard: another shard name).
func (ls otherLeases) sameCount(shards int) bool {
	return slices.ContainsFunc(ls, func(l otherLease) bool { return l.live && l.shards == shards })
}

// readOtherLeases reads the leases of another layout than shard of shards
// (qOtherLayoutLeases).
func readOtherLeases(ctx context.Context, tx pgx.Tx, shards int, shard string) (otherLeases, error) {
	rows, err := tx.Query(ctx, qOtherLayoutLeases, shards, shard)
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	ls, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (otherLease, error) {
		var l otherLease
		err := row.Scan(&l.shard, &l.shards, &l.holder, &l.live)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	return ls, nil
}

// settleLayout finishes what relays with another shard count left, once
// all their leases have expired and before any relay with this count
// takes a lease: for each of their shards it fences the shard's
// transactional.id (which completes or aborts its open transaction), marks
// the rows its last checkpoint names (all of them: they are on Kafka,
// whichever shard owns their source now) and deletes the lease. Without
// it, a row published but not yet marked under the old count would be
// published again by the shard that owns its source under the new one. It
// holds the lease lock throughout, so no relay takes a lease meanwhile.
func (r *Relay) settleLayout(ctx context.Context) error {
	id, err := r.bindIdentity(ctx)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, r.cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qLeaseLock); err != nil {
			return err
		}
		others, err := readOtherLeases(ctx, tx, r.cfg.Shards, r.cfg.Shard)
		if err != nil || others.live() {
			return err // a live one: acquire waits for it
		}
		for _, o := range others {
			marked, err := r.settleShard(ctx, id, o)
			if err != nil {
				return fmt.Errorf("settle shard %q of %d: %w", o.shard, o.shards, err)
			}
			if _, err := tx.Exec(ctx, qDropLayoutLease, o.shard, o.shards); err != nil {
				return fmt.Errorf("delete lease of shard %q of %d: %w", o.shard, o.shards, err)
			}
			r.log.InfoContext(ctx, "settled a shard of another shard count: its transactional.id fenced, its checkpoint's rows marked, its lease deleted",
				slog.String("old_shard", o.shard), slog.Int("old_shards", o.shards), slog.Int64("marked", marked))
		}
		return nil
	})
}

// settleShard fences the transactional.id of another shard count's shard
// o and marks the rows its last checkpoint names, returning how many.
func (r *Relay) settleShard(ctx context.Context, identity string, o otherLease) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.TransactionTimeout+5*time.Second)
	defer cancel()
	cl, err := r.initProducer(ctx, r.txnIDOf(identity, o.shard))
	if err != nil {
		return 0, err
	}
	cl.Close()
	key := checkpointKey(identity, o.shard)
	rec, err := lastCheckpoint(ctx, r.cfg.Hooks.checkpointReaderOpts(r.cfg.KafkaOpts), r.cfg.CheckpointTopic, key)
	if err != nil || rec == nil {
		return 0, err
	}
	c, err := decodeCheckpoint(rec.Value)
	if err != nil {
		return 0, &IdentityError{
			Problem: fmt.Sprintf("checkpoint record %s[%d]@%d under key %q cannot be read: %v", rec.Topic, rec.Partition, rec.Offset, key, err),
			Fix:     "inspect the record; if no relay of this database wrote it, run `relay identity reset -note …` (docs/relay.md, \"Restored or copied databases\")",
		}
	}
	return r.applyCheckpoint(ctx, c, rec, "checkpoint", nil)
}

func (r *Relay) leaseValid() bool { return time.Since(r.start) < time.Duration(r.validUntil.Load()) }

// lead publishes until ctx is cancelled (graceful stop) or the lease is lost.
func (r *Relay) lead(ctx context.Context, epoch int64) error {
	s := &leaderSession{
		r:        r,
		epoch:    epoch,
		log:      r.log.With(slog.Int64("epoch", epoch)),
		suspects: map[int64]refused{},
		sweep:    newSweeper(),
	}
	return s.run(ctx)
}

// leaderSession is one tenure as leader, from the lease's acquisition to a
// graceful stop or the lease's loss. Three contexts govern it:
//   - the Run context (ctx in run and round) ends it gracefully;
//   - lease is cancelled, with ErrLeadershipLost as its cause, when the lease
//     is lost; it governs the background loops (renewal, LISTEN, stats,
//     pruning), which end with the session;
//   - stop ends waits (polls, backoff, recovery, reads): either of the two
//     above.
//
// In-flight work runs under opCtx, which a graceful stop does not cancel: a
// batch whose Kafka transaction began is committed (or aborted) and marked
// before Run returns.
type leaderSession struct {
	r     *Relay
	epoch int64
	log   *slog.Logger

	lease context.Context
	stop  context.Context
	opCtx context.Context

	wake chan struct{} // LISTEN's wake-ups of the poll loop
	bo   *backoff.ExponentialBackOff
	cl   *kgo.Client // the transactional producer; nil: the next round recovers

	// suspects are rows a refused transaction named: each is published
	// alone next, and set aside if Kafka refuses it alone too.
	suspects map[int64]refused
	// inflight is the mark of the last published batch. The mark of batch
	// N runs while batch N+1 is fetched and published. Batch N+1's
	// checkpoint names both batches, and batch N+2 starts only after N's
	// mark finished, so the last committed checkpoint always covers every
	// row that may be on Kafka but unmarked.
	inflight *markJob
	// sweep is the state of the sweep for unqueued rows (sweep.go).
	sweep *sweeper
}

// markJob is a batch's mark, running concurrently with the next batch.
type markJob struct {
	ids  []int64
	ckpt ckptSet
	done chan error
}

// run starts the session's background loops, publishes round after round,
// and on the way out waits for the last mark, closes the producer, stops the
// loops and releases the lease.
func (s *leaderSession) run(ctx context.Context) error {
	r, log := s.r, s.log
	log.InfoContext(ctx, "leadership acquired")
	r.leader.Store(true)
	r.m.isLeader.Set(1)

	lease, lose := context.WithCancelCause(context.Background())
	var wg sync.WaitGroup
	defer func() {
		r.leader.Store(false)
		r.m.isLeader.Set(0)
		lose(nil)
		wg.Wait()
		s.releaseLease(ctx)
	}()
	s.wake = make(chan struct{}, 1)
	if r.cfg.Listen {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(lease, s.wake, log) }()
	}
	wg.Add(3)
	go func() { defer wg.Done(); r.renewLoop(lease, lose, s.epoch, log) }()
	go func() { defer wg.Done(); r.every(lease, r.cfg.StatsInterval, r.stats) }()
	go func() { defer wg.Done(); r.every(lease, r.cfg.PruneInterval, r.prune) }()

	stop, stopCancel := context.WithCancel(ctx)
	defer stopCancel()
	defer context.AfterFunc(lease, stopCancel)()
	s.lease, s.stop, s.opCtx = lease, stop, context.WithoutCancel(ctx)
	s.bo = r.newBackoff()
	defer func() {
		if s.cl != nil {
			s.cl.Close()
		}
	}()
	defer func() { _ = s.waitMark() }()
	for {
		if done, err := s.round(ctx); done {
			return err
		}
	}
}

// releaseLease lets a standby take over at once.
func (s *leaderSession) releaseLease(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, err := s.r.cfg.DB.Exec(rctx, qReleaseLease, s.r.cfg.Shard, s.r.cfg.HolderID, s.epoch); err != nil {
		s.log.WarnContext(ctx, "release lease", slog.Any("error", err))
	} else {
		s.log.InfoContext(ctx, "lease released")
	}
}

// round is one turn of the publish loop: recover when there is no
// producer, read a batch, screen it, publish it and start its mark. It
// returns done with the error that ends the session (nil: a graceful stop);
// every other failure is counted, logged and backed off here, and the next
// round tries again.
func (s *leaderSession) round(ctx context.Context) (done bool, err error) {
	r := s.r
	if ctx.Err() != nil {
		return true, nil
	}
	if err := context.Cause(s.lease); err != nil || !r.leaseValid() {
		return true, ErrLeadershipLost
	}
	if s.cl == nil {
		c, err := r.recover(s.stop, s.log)
		var ie *IdentityError
		if errors.As(err, &ie) {
			return true, err
		}
		if err != nil {
			if s.stop.Err() == nil {
				s.fail(ctx, errKindCheckpoint, "recover from checkpoint", err)
			}
			return false, nil
		}
		s.cl = c
	}
	var unmarked []int64
	var unmarkedCkpt ckptSet
	if s.inflight != nil {
		unmarked, unmarkedCkpt = s.inflight.ids, s.inflight.ckpt
	}
	tFetch := time.Now()
	rows, err := s.sweepAndFetch(s.stop, unmarked)
	if err != nil {
		if s.stop.Err() == nil {
			s.fail(ctx, errKindPostgres, "read outbox", err)
		}
		return false, nil
	}
	if len(rows) == 0 {
		s.idle(ctx)
		return false, nil
	}
	if rows = s.screen(ctx, rows); len(rows) == 0 {
		return false, nil
	}
	if rows[0].retrying {
		// A set-aside row goes alone (isolate); claim it first, so that an
		// operator's skip and this retry cannot both happen.
		var id int64
		err := r.cfg.DB.QueryRow(s.stop, qSetAsideClaim, rows[0].id).Scan(&id)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			s.log.InfoContext(ctx, "set-aside row skipped (or no longer due) before its retry: not published", slog.Int64("outbox_id", rows[0].id))
			return false, nil
		case err != nil:
			if s.stop.Err() == nil {
				s.fail(ctx, errKindPostgres, "claim set-aside row for its retry", err)
			}
			return false, nil
		}
	}
	return s.publish(ctx, rows, unmarkedCkpt, tFetch)
}

// idle finishes the running mark, or else waits for the next poll (or a
// wake-up).
func (s *leaderSession) idle(ctx context.Context) {
	if s.inflight != nil {
		if err := s.waitMark(); err != nil {
			s.reset()
			s.fail(ctx, errKindPostgres, "mark batch published", err)
		}
		return
	}
	s.bo.Reset()
	t := time.NewTimer(s.r.cfg.PollInterval)
	select {
	case <-s.stop.Done():
	case <-t.C:
	case <-s.wake:
	}
	t.Stop()
}

// screen returns the part of rows to publish now (none: the round is
// over). A row that Kafka refused (or will: an illegal topic name) goes
// alone; refused alone, it is set aside and only its source waits. Topics
// are checked against Config.TopicCheck before their first publish.
func (s *leaderSession) screen(ctx context.Context, rows []row) []row {
	r := s.r
	if len(s.suspects) > 4*r.cfg.BatchMaxRows {
		clear(s.suspects) // bounded; a suspect forgotten is found again
	}
	rows = isolate(rows, s.suspects)
	if len(rows) == 1 && rows[0].oversized {
		s.setAside(ctx, rows[0], ReasonTooLarge, fmt.Errorf(
			"row is %d bytes (payload, key, headers and names), over the relay's batch-max-bytes of %d: not read; "+
				"raise -batch-max-bytes (and the topic's max.message.bytes) and retry it, or skip it",
			rows[0].size, r.cfg.BatchMaxBytes))
		return nil
	}
	if k, err := r.reservedRow(rows); err != nil {
		if k > 0 {
			return rows[:k] // publish what is before the reserved topic
		}
		s.setAside(ctx, rows[0], ReasonInvalidTopic, err)
		return nil
	}
	if len(rows) == 1 {
		if err := outbox.CheckTopic(rows[0].topic); err != nil {
			s.setAside(ctx, rows[0], ReasonInvalidTopic, err)
			return nil
		}
	}
	if k, err := r.checkTopics(s.stop, rows); err != nil {
		switch {
		case s.stop.Err() != nil:
			return nil
		case k > 0:
			return rows[:k] // publish what is before the refused topic
		case errors.Is(err, ErrTopicRefused):
			r.m.errors.WithLabelValues(errKindTopic).Inc()
			s.setAside(ctx, rows[0], ReasonTopicContract, err)
			return nil
		default:
			s.fail(ctx, errKindTopic, "check topic against its contract (retrying; the batch waits)", err)
			return nil
		}
	}
	return rows
}

// publish commits rows in one Kafka transaction, then starts their mark
// once the previous batch's mark finished.
func (s *leaderSession) publish(ctx context.Context, rows []row, unmarkedCkpt ckptSet, tFetch time.Time) (done bool, err error) {
	r, log := s.r, s.log
	tPublish := time.Now()
	txn := r.startTxn(s.opCtx, rows, len(unmarkedCkpt.fps))
	err = r.publish(txn.ctx, s.cl, rows, unmarkedCkpt)
	txn.end(err)
	if err != nil {
		// Whatever happened, the producer is thrown away and the next
		// round recovers through the checkpoint: a new producer with the
		// same transactional.id completes or aborts whatever this one
		// left, and the checkpoint says what committed.
		s.reset()
		var re *refusedError
		switch {
		case errors.Is(err, ErrLeadershipLost):
			return true, err
		case errors.As(err, &re):
			if len(rows) > 1 {
				// Refused in company: each suspect goes alone next, the
				// others go on in batches.
				for id, rf := range re.refused {
					s.suspects[id] = rf
				}
				log.WarnContext(txn.ctx, "publish batch: Kafka refused records; trying them one by one", slog.Any("error", err))
				return false, nil
			}
			rf := re.refused[rows[0].id]
			if isTopicReason(rf.reason) {
				r.m.errors.WithLabelValues(errKindTopic).Inc()
			}
			s.setAside(ctx, rows[0], rf.reason, rf.err)
			delete(s.suspects, rows[0].id)
		case errors.Is(err, errUnknownOutcome):
			s.fail(txn.ctx, errKindUnknown, "publish batch: commit outcome unknown, recovering from checkpoint", err)
		default:
			s.fail(txn.ctx, errKindKafka, "publish batch", err)
		}
		return false, nil
	}
	r.cfg.Hooks.afterKafkaCommit()
	tMark := time.Now()
	if err := s.waitMark(); err != nil {
		// Both batches are on Kafka; this batch's checkpoint names both.
		s.reset()
		s.fail(ctx, errKindPostgres, "mark batch published", err)
		return false, nil
	}
	ids := make([]int64, len(rows))
	ckpt := newCkptSet(len(rows))
	for i, w := range rows {
		ids[i] = w.id
		ckpt.add(w)
		delete(s.suspects, w.id)
	}
	job := &markJob{ids: ids, ckpt: ckpt, done: make(chan error, 1)}
	go func() { job.done <- r.mark(s.opCtx, job.ids) }()
	s.inflight = job
	if log.Enabled(ctx, slog.LevelDebug) {
		log.DebugContext(txn.ctx, "batch published", slog.Int("rows", len(rows)),
			slog.Duration("fetch", tPublish.Sub(tFetch)), slog.Duration("kafka", tMark.Sub(tPublish)),
			slog.Duration("previous_mark_wait", time.Since(tMark)))
	}
	s.bo.Reset()
	return false, nil
}

// setAside sets a row aside (Relay.setAside), counting and backing off a
// failure to record it.
func (s *leaderSession) setAside(ctx context.Context, w row, reason string, cause error) {
	if err := s.r.setAside(s.stop, w, reason, cause, s.log); err != nil && s.stop.Err() == nil {
		s.fail(ctx, errKindPostgres, "set row aside", err)
	}
}

// waitMark waits for the running mark, if any.
func (s *leaderSession) waitMark() error {
	if s.inflight == nil {
		return nil
	}
	err := <-s.inflight.done
	s.inflight = nil
	if err != nil {
		return fmt.Errorf("mark batch published: %w", err)
	}
	return nil
}

// reset throws the producer away: the next round recovers.
func (s *leaderSession) reset() {
	_ = s.waitMark()
	if s.cl != nil {
		s.cl.Close()
		s.cl = nil
	}
}

// fail counts and logs a failure, then backs off (until stop). The log
// line carries ctx's span: a failed transaction's carries its trace_id.
func (s *leaderSession) fail(ctx context.Context, kind, what string, err error) {
	s.r.m.errors.WithLabelValues(kind).Inc()
	s.log.ErrorContext(ctx, what, slog.String("kind", kind), slog.Any("error", err))
	_ = sleep(s.stop, s.bo.NextBackOff())
}

// listen turns notifications on notifyChannel into wake-ups of the poll
// loop, reconnecting with backoff. It is only ever a hint.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}, log *slog.Logger) {
	bo := r.newBackoff()
	for ctx.Err() == nil {
		err := func() error {
			conn, err := r.cfg.DB.Acquire(ctx)
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
		r.m.errors.WithLabelValues(errKindPostgres).Inc()
		log.WarnContext(ctx, "listen for outbox notifications", slog.Any("error", err))
		_ = sleep(ctx, bo.NextBackOff())
	}
}

// renewLoop renews the lease every LeaseRenewInterval and cancels leaseCtx
// when the lease is lost or cannot be renewed before it runs out.
func (r *Relay) renewLoop(leaseCtx context.Context, lose context.CancelCauseFunc, epoch int64, log *slog.Logger) {
	t := time.NewTicker(r.cfg.LeaseRenewInterval)
	defer t.Stop()
	for {
		remaining := time.Duration(r.validUntil.Load()) - time.Since(r.start)
		if remaining <= 0 {
			r.m.errors.WithLabelValues(errKindLease).Inc()
			log.Error("lease ran out before it could be renewed: stopping publishing")
			lose(ErrLeadershipLost)
			return
		}
		expire := time.NewTimer(remaining)
		select {
		case <-leaseCtx.Done():
			expire.Stop()
			return
		case <-expire.C:
			continue
		case <-t.C:
			expire.Stop()
		}
		t0 := time.Since(r.start)
		qctx, cancel := context.WithTimeout(leaseCtx, max(remaining, time.Millisecond))
		tag, err := r.cfg.DB.Exec(qctx, qRenewLease, r.cfg.Shard, r.cfg.HolderID, epoch, r.cfg.LeaseTTL.Seconds())
		cancel()
		switch {
		case leaseCtx.Err() != nil:
			return
		case err != nil:
			r.setReady(fmt.Errorf("renew lease: %w", err))
			r.m.errors.WithLabelValues(errKindLease).Inc()
			log.Warn("renew lease", slog.Any("error", err))
		case tag.RowsAffected() == 0:
			r.m.errors.WithLabelValues(errKindLease).Inc()
			log.Error("lease lost: another relay holds it now: stopping publishing")
			lose(ErrLeadershipLost)
			return
		default:
			r.setReady(nil)
			r.validUntil.Store(int64(t0 + r.cfg.LeaseTTL))
		}
	}
}

func (r *Relay) every(ctx context.Context, d time.Duration, f func(context.Context) error) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		if err := f(ctx); err != nil && ctx.Err() == nil {
			r.m.errors.WithLabelValues(errKindPostgres).Inc()
			r.log.WarnContext(ctx, "relay housekeeping", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Relay) stats(ctx context.Context) error {
	var n, held, open int64
	var age float64
	q, args := r.sharded(qStats, qStatsShard)
	if err := r.cfg.DB.QueryRow(ctx, q, args...).Scan(&n, &held, &age, &open); err != nil {
		return fmt.Errorf("count pending rows: %w", err)
	}
	r.m.pending.Set(float64(n))
	r.m.held.Set(float64(held))
	r.m.oldestAge.Set(age)
	r.m.setAside.Set(float64(open))
	if r.cfg.Shards > 1 {
		// A shard nobody runs publishes nothing and its lag shows nowhere
		// else: every leader reports it.
		var leaderless int64
		if err := r.cfg.DB.QueryRow(ctx, qLeaderlessShards, r.cfg.Shards).Scan(&leaderless); err != nil {
			return fmt.Errorf("count shards without leader: %w", err)
		}
		r.m.leaderless.Set(float64(leaderless))
	}
	return nil
}

// prune deletes published rows older than the retention, whole publish
// batches at a time (about PruneBatchRows rows per statement), at most 100
// statements per call so that it yields to the publisher's connection use;
// under steady load it keeps up as long as one call deletes more than
// PruneInterval's worth of published rows. Every shard's leader prunes
// whichever batches are due (a batch another is pruning is skipped).
func (r *Relay) prune(ctx context.Context) error {
	retention := max(r.cfg.Retention, 0).Seconds()
	for range 100 {
		var rows, batches int64
		if err := r.cfg.DB.QueryRow(ctx, qPrune, retention, r.cfg.PruneBatchRows).Scan(&rows, &batches); err != nil {
			return fmt.Errorf("prune outbox: %w", err)
		}
		r.m.pruned.Add(float64(rows))
		if batches == 0 {
			return nil
		}
	}
	return nil
}

// recover binds the relay to this database's identity, builds a new
// transactional producer and finishes the last batch: initialising the
// transactional.id fences any older producer with it and completes or
// aborts its pending transaction; then the rows the last committed
// checkpoint names are marked published, once the checkpoint is proven to be
// this database's, row by row. Only the last two batches can be on Kafka but
// unmarked (batch N's mark finishes before batch N+2 begins), and the last
// checkpoint names both.
func (r *Relay) recover(ctx context.Context, log *slog.Logger) (*kgo.Client, error) {
	id, err := r.bindIdentity(ctx)
	if err != nil {
		return nil, err
	}
	r.txnID = r.txnIDOf(id, r.cfg.Shard)
	r.ckptKey = checkpointKey(id, r.cfg.Shard)

	ictx, cancel := context.WithTimeout(ctx, r.cfg.TransactionTimeout+5*time.Second)
	defer cancel()
	if err := r.settleLegacy(ictx, log); err != nil {
		return nil, err
	}
	cl, err := r.initProducer(ictx, r.txnID)
	if err != nil {
		return nil, err
	}
	rec, err := lastCheckpoint(ictx, r.cfg.Hooks.checkpointReaderOpts(r.cfg.KafkaOpts), r.cfg.CheckpointTopic, r.ckptKey)
	if err != nil {
		cl.Close()
		return nil, err
	}
	attrs := []any{slog.String("transactional_id", r.txnID), slog.String("checkpoint_key", r.ckptKey)}
	if rec == nil {
		r.recovered = &recovery{}
		log.InfoContext(ctx, "producer ready, recovered from checkpoint", append(attrs, slog.String("checkpoint", "none"))...)
		return cl, nil
	}
	c, err := decodeCheckpoint(rec.Value)
	if err != nil {
		cl.Close()
		return nil, &IdentityError{
			Problem: fmt.Sprintf("checkpoint record %s[%d]@%d under key %q cannot be read: %v", rec.Topic, rec.Partition, rec.Offset, r.ckptKey, err),
			Fix:     "inspect the record; if this relay did not write it, run `relay identity reset -note …` (docs/relay.md, \"Restored or copied databases\")",
		}
	}
	marked, err := r.applyCheckpoint(ictx, c, rec, "checkpoint", r.ownSource)
	if err != nil {
		cl.Close()
		return nil, err
	}
	r.recovered = &recovery{checkpointIDs: len(c.ids), marked: marked}
	log.InfoContext(ctx, "producer ready, recovered from checkpoint", append(attrs,
		slog.Int64("checkpoint_offset", rec.Offset), slog.Int("checkpoint_ids", len(c.ids)), slog.Int64("marked", marked))...)
	return cl, nil
}

// bindIdentity binds the relay to this database's identity (see the
// package function) and returns it; the identity may not change while the
// relay runs.
func (r *Relay) bindIdentity(ctx context.Context) (string, error) {
	id, reminted, err := identity.Bind(ctx, r.cfg.DB)
	var moved *identity.MovedError
	if errors.As(err, &moved) {
		err = &IdentityError{
			Problem: fmt.Sprintf("database identity %s belongs to %s, but this is %s: the database was copied or moved (restore, dump and restore, pg_upgrade, CREATE DATABASE … TEMPLATE)",
				moved.ID, moved.Belongs, moved.Here),
			Fix: "if this database replaces the original (moved, upgraded, restored in its place), run `relay identity adopt -note …`; " +
				"if it is a separate copy that must publish on its own, run `relay identity reset -note …` (docs/relay.md, \"Restored or copied databases\")",
		}
	}
	if err != nil {
		return "", fmt.Errorf("database identity: %w", err)
	}
	if reminted {
		r.log.InfoContext(ctx, "new database identity: this database is a copy of one whose relay never ran",
			slog.String("identity", id.ID), slog.String("place", id.Place.String()))
	}
	if r.identity != "" && r.identity != id.ID {
		return "", &IdentityError{
			Problem: fmt.Sprintf("the database identity changed from %s to %s while this relay ran (relay identity reset)", r.identity, id.ID),
			Fix:     "restart the relay so that it publishes under the new identity",
		}
	}
	r.identity = id.ID
	return id.ID, nil
}

// txnIDOf is the transactional.id of shard under identity.
func (r *Relay) txnIDOf(identity, shard string) string {
	if r.cfg.TransactionalIDPrefix == "" {
		return DefaultTransactionalID(identity, shard)
	}
	return r.cfg.TransactionalIDPrefix + shard
}

// initProducer creates a transactional producer and initialises its id.
func (r *Relay) initProducer(ctx context.Context, txnID string) (*kgo.Client, error) {
	opts := append(slices.Clone(r.cfg.KafkaOpts),
		kgo.TransactionalID(txnID),
		kgo.TransactionTimeout(r.cfg.TransactionTimeout),
		kgo.RecordDeliveryTimeout(r.cfg.TransactionTimeout/2),
		kgo.UnknownTopicRetries(3),
		kgo.MaxBufferedRecords(r.cfg.BatchMaxRows+16),
		kgo.ProducerLinger(0),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("new producer: %w", err)
	}
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("init transactional id %q: %w", txnID, err)
	}
	return cl, nil
}

// applyCheckpoint proves that checkpoint c is this database's and marks the
// unpublished rows it names. The proof: the record carries this database's
// identity; no id it names is above what the outbox's sequence has handed
// out (else the database was restored to an earlier point after those rows
// were published); every named row still in the table holds the event
// the checkpoint recorded for it; and every stream the record names still
// has the event at its highest seq, or a counter that reached it
// (checkStreams). Anything else is an *IdentityError: the
// relay stops rather than mark a row on a guess. With own set, a row whose
// source own rejects is checked but left unmarked: recovery touches only
// its own shard's rows.
func (r *Relay) applyCheckpoint(ctx context.Context, c checkpoint, rec *kgo.Record, what string, own func(source string) bool) (int64, error) {
	where := fmt.Sprintf("%s record %s[%d]@%d (key %q)", what, rec.Topic, rec.Partition, rec.Offset, string(rec.Key))
	if c.fps != nil && c.db != r.identity {
		return 0, &IdentityError{
			Problem: fmt.Sprintf("%s names database identity %s, not this database's %s", where, c.db, r.identity),
			Fix:     "another relay writes this database's checkpoint key; find it (same -checkpoint-topic and identity) and stop it, then restart this relay",
		}
	}
	if len(c.ids) == 0 {
		return 0, nil
	}
	var last *int64
	if err := r.cfg.DB.QueryRow(ctx, qOutboxLastID).Scan(&last); err != nil {
		return 0, fmt.Errorf("read the outbox id sequence: %w", err)
	}
	if top := c.ids[len(c.ids)-1]; last == nil || top > *last {
		handed := "none"
		if last != nil {
			handed = strconv.FormatInt(*last, 10)
		}
		return 0, &IdentityError{
			Problem: fmt.Sprintf("%s names outbox ids up to %d, but this database's outbox sequence has handed out ids only up to %s: "+
				"the database was restored to an earlier point (or the sequence reset) after the relay had published those rows", where, top, handed),
			Fix: "events published after the restore point are on Kafka but no longer here, and their streams' seqs will be handed out again: " +
				"raise those streams' counters in onceflow.source_seq (a row per source and topic) past what consumers saw, then run `relay identity reset -note …` " +
				"(docs/relay.md, \"Restored or copied databases\")",
		}
	}
	rows, err := r.cfg.DB.Query(ctx, qCheckpointRows, c.ids)
	if err != nil {
		return 0, fmt.Errorf("read checkpointed rows: %w", err)
	}
	var mark []int64
	var mismatch error
	for rows.Next() {
		var id int64
		var eventID, source string
		var unpublished bool
		if err := rows.Scan(&id, &eventID, &source, &unpublished); err != nil {
			rows.Close()
			return 0, fmt.Errorf("read checkpointed rows: %w", err)
		}
		if c.fps != nil {
			i, ok := slices.BinarySearch(c.ids, id)
			if !ok || c.fps[i] != fingerprint(eventID) {
				if mismatch == nil {
					mismatch = &IdentityError{
						Problem: fmt.Sprintf("%s recorded another event for outbox row %d than the %q it holds: "+
							"this database is not the one the checkpoint was written for (a copy, or restored and written to since)", where, id, eventID),
						Fix: "if this database is a copy that must publish on its own, run `relay identity reset -note …`; " +
							"if it was restored in place, see docs/relay.md, \"Restored or copied databases\"",
					}
				}
				continue
			}
		}
		switch {
		case unpublished && own != nil && !own(source):
			r.log.WarnContext(ctx, "checkpoint names an unpublished row of another shard: left to that shard",
				slog.Int64("outbox_id", id), slog.String("source", source), slog.String("where", where))
		case unpublished:
			mark = append(mark, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("read checkpointed rows: %w", err)
	}
	if mismatch != nil {
		return 0, mismatch
	}
	// The rows still here hold the checkpoint's events; the streams' seqs
	// prove that the ones no longer here were not lost to a restore.
	if err := r.checkStreams(ctx, c, where); err != nil {
		return 0, err
	}
	if len(mark) == 0 {
		return 0, nil
	}
	var marked, resolved int64
	if err := r.cfg.DB.QueryRow(ctx, r.markQuery(), mark).Scan(&marked, &resolved); err != nil {
		return 0, fmt.Errorf("mark checkpointed rows: %w", err)
	}
	return marked, nil
}

// checkStreams proves, for every stream c's hi field names, that this
// database has not lost the event it names: the row holding that seq is
// there with the same event, or it is gone (pruned, deleted on publish,
// skipped) and the stream's counter has reached the seq. A counter never goes
// backwards but by a restore, so this does not depend on how far ahead
// PostgreSQL logged the outbox's id sequence. A database restored to before
// the checkpoint's last rows fails it (an *IdentityError), whether or not
// new events were written since.
func (r *Relay) checkStreams(ctx context.Context, c checkpoint, where string) error {
	if len(c.hi) == 0 {
		return nil
	}
	topics, sources, seqs := make([]string, len(c.hi)), make([]string, len(c.hi)), make([]int64, len(c.hi))
	for i, h := range c.hi {
		topics[i], sources[i], seqs[i] = h.topic, h.source, h.seq
	}
	rows, err := r.cfg.DB.Query(ctx, qCheckpointStreams, topics, sources, seqs)
	if err != nil {
		return fmt.Errorf("read checkpointed streams: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var ord int64
		var id, counter *int64
		var eventID *string
		if err := rows.Scan(&ord, &id, &eventID, &counter); err != nil {
			return fmt.Errorf("read checkpointed streams: %w", err)
		}
		h := c.hi[ord-1]
		fix := "events published after the restore point are on Kafka but no longer here, and their sources' seqs will be handed out again: " +
			"raise those sources' onceflow.source_seq counters past what consumers saw, then run `relay identity reset -note …` " +
			"(docs/relay.md, \"Restored or copied databases\")"
		switch {
		case eventID != nil && fingerprint(*eventID) != h.fp:
			return &IdentityError{
				Problem: fmt.Sprintf("%s names seq %d of source %q on topic %q (outbox row %d), but this database holds another event, %q (row %d), at that seq: "+
					"the database was restored to an earlier point after the relay had published that event, and written to since", where, h.seq, h.source, h.topic, h.id, *eventID, *id),
				Fix: fix,
			}
		case eventID == nil && (counter == nil || *counter < h.seq):
			have := "no counter"
			if counter != nil {
				have = "a counter at " + strconv.FormatInt(*counter, 10)
			}
			return &IdentityError{
				Problem: fmt.Sprintf("%s names seq %d of source %q on topic %q (outbox row %d), but this database has neither that row nor a seq that high (%s): "+
					"the database was restored to an earlier point (or the counter reset) after the relay had published that event", where, h.seq, h.source, h.topic, h.id, have),
				Fix: fix,
			}
		}
	}
	return rows.Err()
}

// settleLegacy deals, once, with every checkpoint a relay wrote before
// databases had identities (under the bare shard name, which every
// database's relay shared), whatever shard layout runs now: the legacy
// relay's shard names ("default", …) need not be shards of this layout
// (from one relay to -shards N, or a renamed shard), and the rows its last
// checkpoint names may belong to any shard now. Each is settled by
// settleLegacyShard; the first that cannot be is returned.
func (r *Relay) settleLegacy(ctx context.Context, log *slog.Logger) error {
	if r.legacySettled {
		return nil
	}
	rows, err := r.cfg.DB.Query(ctx, qLegacyPendingAll)
	if err != nil {
		return fmt.Errorf("read legacy checkpoint state: %w", err)
	}
	type pending struct {
		shard    string
		decision *string
	}
	ps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pending, error) {
		var p pending
		err := row.Scan(&p.shard, &p.decision)
		return p, err
	})
	if err != nil {
		return fmt.Errorf("read legacy checkpoint state: %w", err)
	}
	// This relay's own shard first: its refusal is the one its operator
	// expects.
	slices.SortStableFunc(ps, func(a, b pending) int {
		return cmp.Compare(boolInt(a.shard != r.cfg.Shard), boolInt(b.shard != r.cfg.Shard))
	})
	for _, p := range ps {
		if err := r.settleLegacyShard(ctx, log, p.shard, identity.Deref(p.decision)); err != nil {
			return err
		}
	}
	r.legacySettled = true
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// settleLegacyShard settles the legacy checkpoint of shard name. It first
// fences the old transactional.id (any relay of the previous version still
// running stops publishing) and then reads that checkpoint to its measured
// end:
//   - none there, or it names no row that is unpublished here: settled;
//   - an operator decided "adopt" (`relay identity legacy adopt`): its rows
//     are marked (all of them, whichever shard owns their source now), after
//     the sequence check (no fingerprints in version 1);
//   - "discard": settled; its rows are published again (duplicates that
//     consumers drop by event id, never a loss);
//   - no decision: an *IdentityError naming both commands.
//
// Relays of several shards may settle the same name at once: fencing twice
// and marking twice are harmless, and the first to record the outcome wins.
func (r *Relay) settleLegacyShard(ctx context.Context, log *slog.Logger, name, decision string) error {
	log = log.With(slog.String("legacy_shard", name))
	legacyTxn := r.cfg.TransactionalIDPrefix + name
	if r.cfg.TransactionalIDPrefix == "" {
		legacyTxn = "onceflow-relay-" + name
	}
	// Initialising the old transactional.id fences a relay of the previous
	// version still running and ends its open transaction, so that the
	// read below sees its last checkpoint decided.
	cl, err := r.initProducer(ctx, legacyTxn)
	if err != nil {
		return fmt.Errorf("fence the previous relay version: %w", err)
	}
	cl.Close()
	settle := func(outcome string) error {
		if _, err := r.cfg.DB.Exec(ctx, qLegacySettle, name, outcome); err != nil {
			return fmt.Errorf("settle legacy checkpoint: %w", err)
		}
		log.InfoContext(ctx, "legacy checkpoint settled", slog.String("outcome", outcome))
		return nil
	}
	rec, err := lastCheckpoint(ctx, r.cfg.Hooks.checkpointReaderOpts(r.cfg.KafkaOpts), r.cfg.CheckpointTopic, name)
	if err != nil {
		return fmt.Errorf("read legacy checkpoint: %w", err)
	}
	if rec == nil {
		return settle(fmt.Sprintf("no checkpoint under the legacy key %q in %s", name, r.cfg.CheckpointTopic))
	}
	c, err := decodeCheckpoint(rec.Value)
	if err != nil || c.fps != nil {
		return &IdentityError{
			Problem: fmt.Sprintf("legacy checkpoint record %s[%d]@%d under key %q is not a version 1 checkpoint (%v)", rec.Topic, rec.Partition, rec.Offset, name, err),
			Fix:     fmt.Sprintf("run `relay identity legacy discard -shard %s` once you know what wrote it", name),
		}
	}
	var unpublished int64
	if err := r.cfg.DB.QueryRow(ctx, qUnpublishedAmong, c.ids).Scan(&unpublished); err != nil {
		return fmt.Errorf("read legacy checkpoint rows: %w", err)
	}
	desc := fmt.Sprintf("legacy checkpoint %s[%d]@%d %q", rec.Topic, rec.Partition, rec.Offset, truncate(string(rec.Value), 60))
	switch {
	case unpublished == 0:
		return settle(desc + ": names no row unpublished here, nothing to do")
	case decision == "discard":
		return settle(fmt.Sprintf("%s: discarded; %d rows it names are published again", desc, unpublished))
	case decision == "adopt":
		marked, err := r.applyCheckpoint(ctx, c, rec, "legacy checkpoint", nil)
		if err != nil {
			return err
		}
		return settle(fmt.Sprintf("%s: adopted, %d rows marked published", desc, marked))
	}
	return &IdentityError{
		Problem: fmt.Sprintf("the relay version before database identities left %s, naming %d rows that are unpublished here; "+
			"every database's relay wrote that key, so nothing proves it is this database's", desc, unpublished),
		Fix: fmt.Sprintf("if no other database's relay ever used -checkpoint-topic %s with -shard %s, run `relay identity legacy adopt -shard %s` "+
			"(its rows are marked, nothing is published twice); otherwise run `relay identity legacy discard -shard %s` "+
			"(its rows are published again; consumers drop the duplicates by event id) (docs/relay.md, \"Upgrading\")",
			r.cfg.CheckpointTopic, name, name, name),
	}
}

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
func (r *Relay) fetch(ctx context.Context, tx dbtx.DB, exclude []int64) ([]row, error) {
	if exclude == nil {
		exclude = []int64{}
	}
	budget := int64(r.cfg.BatchMaxBytes)
	q, args := r.sharded(qSelectBatch, qSelectBatchShard, r.cfg.BatchMaxRows, exclude, budget)
	rs, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
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

// sharded returns the statement for this relay's rows: whole when Shards is
// 1, else shard with the shard count and this shard's index appended to
// args.
func (r *Relay) sharded(whole, shard string, args ...any) (string, []any) {
	if r.cfg.Shards <= 1 {
		return whole, args
	}
	return shard, append(args, r.cfg.Shards, r.shardIndex)
}

// isolate shortens a batch so that a suspect row (refused in an earlier
// transaction, being retried after it was set aside, over the byte budget,
// or with a topic name Kafka would refuse) is published, or set aside,
// alone: the batch stops before the first suspect, and a batch that starts
// with one holds only it. Every row before it is older, so order is kept.
func isolate(rows []row, suspects map[int64]refused) []row {
	for i, w := range rows {
		_, suspect := suspects[w.id]
		if suspect || w.retrying || w.oversized || outbox.CheckTopic(w.topic) != nil {
			if i == 0 {
				return rows[:1]
			}
			return rows[:i]
		}
	}
	return rows
}

func isTopicReason(reason string) bool {
	switch reason {
	case ReasonInvalidTopic, ReasonTopicAuthorization, ReasonTopicMissing, ReasonTopicContract:
		return true
	}
	return false
}

// setAside records w, which Kafka refused on its own, in
// onceflow.outbox_set_aside: from the next poll on, no row of its source is
// published until it is resolved (R2), and every other source flows (I3).
func (r *Relay) setAside(ctx context.Context, w row, reason string, cause error, log *slog.Logger) error {
	if !r.leaseValid() {
		return ErrLeadershipLost
	}
	retry := 0.0
	if retriedByRelay(reason) {
		retry = r.cfg.RetrySetAsideAfter.Seconds()
	}
	msg := truncate(cause.Error(), 2000)
	var inserted bool
	var attempts int
	err := r.cfg.DB.QueryRow(ctx, qSetAside, w.id, reason, msg, retry, maxSetAsideRetry.Seconds()).Scan(&inserted, &attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // published or deleted meanwhile
	}
	if err != nil {
		return fmt.Errorf("set outbox row %d aside: %w", w.id, err)
	}
	if inserted {
		r.m.setAsideAll.WithLabelValues(reason).Inc()
		r.m.setAside.Inc() // until the next stats refresh
	}
	wait := "an operator (relay outbox failed retry|skip)"
	if retry > 0 {
		wait = "the relay's next try, or an operator"
	}
	log.ErrorContext(ctx, "outbox row set aside: Kafka refuses it or it is over the relay's byte limit; its source waits, every other source flows",
		slog.Int64("outbox_id", w.id), slog.String("event_id", w.eventID), slog.String("topic", w.topic),
		slog.String("source", w.source), slog.Int64("seq", w.seq), slog.String("reason", reason),
		slog.Int("attempts", attempts), slog.String("waits_for", wait), slog.String("error", msg))
	return nil
}

var errUnknownOutcome = errors.New("kafka transaction outcome unknown")

// publish writes rows and their checkpoint record in one Kafka transaction
// and commits it. A nil error means committed. A *refusedError means Kafka
// refused some records for good (and nothing was committed); unmarked are
// the ids and fingerprints of the previous batch, whose mark is running.
func (r *Relay) publish(ctx context.Context, cl *kgo.Client, rows []row, unmarked ckptSet) error {
	if !r.leaseValid() {
		return ErrLeadershipLost
	}
	begun := time.Now()
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	recs := make([]*kgo.Record, 0, len(rows)+1)
	rowOf := make(map[*kgo.Record]int64, len(rows))
	// The checkpoint names every id that may be on Kafka but unmarked once
	// this transaction commits: this batch and the previous one, whose mark
	// is still running.
	ckpt := newCkptSet(len(rows) + len(unmarked.fps))
	ckpt.merge(unmarked)
	for _, w := range rows {
		ckpt.add(w)
		env := envelope.Envelope{
			EventID: w.eventID, Source: w.source, Seq: w.seq, EventType: w.eventType,
			ContentType: w.contentType, Key: w.key, Payload: w.payload,
			// The stream's producer: this database's identity (I5).
			Producer: r.identity,
		}
		if tp, ok := w.headers[envelope.HeaderTraceparent]; ok {
			env.Traceparent = tp
			delete(w.headers, envelope.HeaderTraceparent)
		}
		for k := range w.headers {
			// A row stored before "producer" was reserved may carry it as an
			// application header; the envelope's own value wins.
			if strings.EqualFold(k, envelope.HeaderProducer) {
				delete(w.headers, k)
			}
		}
		env.Headers = w.headers
		rec := env.Record(w.topic)
		rowOf[rec] = w.id
		recs = append(recs, rec)
	}
	recs = append(recs, &kgo.Record{Topic: r.cfg.CheckpointTopic, Key: []byte(r.ckptKey), Value: encodeCheckpointSet(r.identity, ckpt)})

	pctx, cancel := context.WithTimeout(ctx, r.cfg.TransactionTimeout)
	defer cancel()
	var produceErr error
	var refusedRows map[int64]refused
	for _, res := range cl.ProduceSync(pctx, recs...) {
		if res.Err == nil {
			continue
		}
		if id, ok := rowOf[res.Record]; ok {
			if reason := refusal(res.Err); reason != "" {
				if refusedRows == nil {
					refusedRows = map[int64]refused{}
				}
				refusedRows[id] = refused{reason: reason, err: fmt.Errorf("produce to %q: %w", res.Record.Topic, res.Err)}
				continue
			}
		}
		if produceErr == nil {
			produceErr = fmt.Errorf("produce to %q: %w", res.Record.Topic, res.Err)
		}
	}
	if refusedRows != nil {
		produceErr = &refusedError{refused: refusedRows}
	}
	if produceErr == nil && !r.leaseValid() {
		produceErr = ErrLeadershipLost
	}
	if produceErr != nil {
		// Abort; any error here leaves the outcome to the next producer's
		// initialisation, which aborts the transaction for certain (this
		// one never asked to commit).
		if err := cl.AbortBufferedRecords(pctx); err != nil {
			return errors.Join(produceErr, fmt.Errorf("abort buffered records: %w", err))
		}
		if err := cl.EndTransaction(pctx, kgo.TryAbort); err != nil {
			return errors.Join(produceErr, fmt.Errorf("abort transaction: %w", err))
		}
		return produceErr
	}
	r.cfg.Hooks.beforeKafkaCommit()
	if err := cl.EndTransaction(pctx, kgo.TryCommit); err != nil {
		if errors.Is(err, kerr.OperationNotAttempted) {
			// Not committed: abort, and say so.
			aerr := cl.EndTransaction(pctx, kgo.TryAbort)
			return errors.Join(fmt.Errorf("commit not attempted: %w", err), aerr)
		}
		return fmt.Errorf("%w: commit: %w", errUnknownOutcome, err)
	}
	r.m.txnDuration.Observe(time.Since(begun).Seconds())
	r.m.batchSize.Observe(float64(len(rows)))
	r.m.published.Add(float64(len(rows)))
	return nil
}

// mark records the committed batch as published, retrying briefly.
func (r *Relay) mark(ctx context.Context, ids []int64) error {
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	bo := r.newBackoff()
	return backoff.Retry(func() error {
		var marked, resolved int64
		err := r.cfg.DB.QueryRow(mctx, r.markQuery(), ids).Scan(&marked, &resolved)
		if err != nil && mctx.Err() != nil {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(bo, mctx))
}

func (r *Relay) markQuery() string {
	if r.cfg.DeleteOnPublish {
		return qDeletePublished
	}
	return qMarkPublished
}

func (r *Relay) newBackoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = r.cfg.BackoffMax
	bo.MaxElapsedTime = 0
	bo.Reset()
	return bo
}

// retry runs f until it succeeds or ctx ends, with backoff.
func (r *Relay) retry(ctx context.Context, kind, what string, f func() error) error {
	bo := r.newBackoff()
	for {
		err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.m.errors.WithLabelValues(kind).Inc()
		r.log.ErrorContext(ctx, what, slog.Any("error", err))
		if err := sleep(ctx, bo.NextBackOff()); err != nil {
			return err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// checkTopics runs Config.TopicCheck once per topic, before the first
// publish to it, and returns the index of the first row whose topic fails
// with the error. A topic that fails stays unchecked and is checked again
// next time.
func (r *Relay) checkTopics(ctx context.Context, rows []row) (int, error) {
	if r.cfg.TopicCheck == nil {
		return 0, nil
	}
	if r.checked == nil {
		r.checked = map[string]bool{}
	}
	for i, w := range rows {
		if r.checked[w.topic] {
			continue
		}
		if err := r.cfg.TopicCheck(ctx, w.topic); err != nil {
			return i, &TopicError{Topic: w.topic, Err: err}
		}
		r.checked[w.topic] = true
	}
	return 0, nil
}
