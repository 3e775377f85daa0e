package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/relay/internal/lease"
	"github.com/onceflow/onceflow/pkg/schema"
)

// Relay publishes the outbox to Kafka. Several relays may run against one
// database: the one holding the shard's lease publishes, the others stand by.
//
// Relay is the façade over the parts that do the work, each the only writer
// of its own state (docs/architecture.md, "The relay's parts"):
//   - the lease (internal/lease) takes, renews and releases the shard's
//     lease and owns its deadline;
//   - the recoverer binds the database identity, fences the previous
//     producer and marks what the last checkpoint names (recovery.go, and
//     legacy_v1.go for the checkpoints of relays before identities);
//   - a publisher is one term as leader and owns all of the term's state:
//     the producer, the batch being marked, the rows under suspicion
//     (publisher.go, reader.go, screen.go);
//   - the housekeeper keeps the metrics, prunes, and listens for new rows
//     (housekeeping.go).
//
// Relay itself writes only whether it leads and whether it is ready.
type Relay struct {
	cfg    Config
	log    *slog.Logger
	m      *metrics
	lay    layout
	lease  *lease.Lease
	rec    *recoverer
	hk     *housekeeper
	topics *topicChecker

	leader   atomic.Bool
	readyErr atomic.Pointer[error]
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
	log := cfg.Logger.With(slog.String("shard", cfg.Shard), slog.String("holder", cfg.HolderID))
	lay := layout{shards: cfg.Shards}
	if cfg.Shards > 1 {
		lay.index, _ = strconv.Atoi(cfg.Shard) // validated
		log = log.With(slog.Int("shards", cfg.Shards))
	}
	return &Relay{
		cfg: cfg,
		log: log,
		m:   m,
		lay: lay,
		lease: lease.New(lease.Config{DB: cfg.DB, Shard: cfg.Shard, Shards: cfg.Shards,
			Holder: cfg.HolderID, TTL: cfg.LeaseTTL}),
		rec:    &recoverer{cfg: cfg, log: log, lay: lay, m: m},
		hk:     &housekeeper{cfg: cfg, log: log, m: m, lay: lay},
		topics: &topicChecker{fn: cfg.TopicCheck},
	}, nil
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

// Run is the protocol: after checking what it runs against, it acquires a
// term (the shard's lease), and for the term recovers (binds the identity,
// fences the previous producer, marks what the last checkpoint names) and
// publishes, recovering again after any failure, until the term ends; then
// it stands by for the next.
//
// It returns nil once ctx is cancelled and the in-flight batch is committed
// (or aborted) and the lease released. It returns an *IdentityError, after
// releasing the lease, when it cannot prove that the database or a
// checkpoint is its own: publishing on would risk marking rows that were
// never published.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.prepare(ctx); err != nil {
		var ce *ConfigError
		if ctx.Err() != nil && !errors.As(err, &ce) {
			return nil
		}
		return err
	}
	for {
		var ie *IdentityError
		epoch, err := r.acquire(ctx)
		switch {
		case err == nil:
			err = r.term(ctx, epoch)
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

// prepare checks what the relay runs against before it takes part in the
// election: the database's encoding (with shards), the schema, the
// checkpoint topic, and registers that topic as reserved. An error after
// ctx ended means nothing.
func (r *Relay) prepare(ctx context.Context) error {
	if r.cfg.Shards > 1 {
		var enc string
		if err := r.retry(ctx, errKindPostgres, "read the database encoding", func() error {
			return r.cfg.DB.QueryRow(ctx, qServerEncoding).Scan(&enc)
		}); err != nil {
			return err // ctx cancelled
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
		return err // ctx cancelled
	}
	r.hk.reserveTopics(ctx)
	return nil
}

// acquire waits until this relay holds the lease and returns its epoch. It
// fails when ctx ends, or with an *IdentityError from settling another
// shard count's leases.
func (r *Relay) acquire(ctx context.Context) (int64, error) {
	logged, layoutLogged := false, ""
	for {
		found, err := r.lease.TryAcquire(ctx)
		switch {
		case err == nil && found.Taken:
			r.setReady(nil)
			r.m.layoutConflict.Set(0)
			return found.Epoch, nil
		case err == nil && found.Others.Live():
			// Another layout leads: this relay waits, ready (a rolling
			// update replacing those relays must go on), counted in
			// onceflow_relay_layout_conflict.
			r.setReady(nil)
			r.m.layoutConflict.Set(1)
			if desc := found.Others.String(); desc != layoutLogged {
				r.m.errors.WithLabelValues(errKindLease).Inc()
				if found.Others.SameCount(r.cfg.Shards) {
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
		case err == nil && len(found.Others) > 0:
			// Only expired leases of another count: settle their last
			// checkpoints, then try again at once.
			err = r.rec.settleLayout(ctx, r.lease)
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
		case err == nil && found.Busy:
			// Another relay is taking a lease (milliseconds) or settling
			// another shard count (seconds): try again soon.
			if err := sleep(ctx, r.cfg.StandbyInterval/10); err != nil {
				return 0, err
			}
			continue
		case err == nil: // found.Held
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

// term is one term as leader, from the lease's acquisition to a graceful
// stop (ctx cancelled) or the lease's loss: it keeps the lease and the
// housekeeping running beside a publisher, and on the way out stops them
// and releases the lease.
func (r *Relay) term(ctx context.Context, epoch int64) error {
	log := r.log.With(slog.Int64("epoch", epoch))
	log.InfoContext(ctx, "leadership acquired")
	r.leader.Store(true)
	r.m.isLeader.Set(1)

	// held is cancelled, with ErrLeadershipLost as its cause, when the
	// lease is lost; it governs the background loops, which end with the
	// term.
	held, lose := context.WithCancelCause(context.Background())
	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); r.keepLease(held, lose, epoch, log) }()
	go func() { defer wg.Done(); r.hk.run(held, wake, log) }()
	defer func() {
		r.leader.Store(false)
		r.m.isLeader.Set(0)
		lose(nil)
		wg.Wait()
		r.release(ctx, epoch, log)
	}()
	p := newPublisher(r, epoch, log)
	return p.run(ctx, held, wake)
}

// release lets a standby take over at once.
func (r *Relay) release(ctx context.Context, epoch int64, log *slog.Logger) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := r.lease.Release(rctx, epoch); err != nil {
		log.WarnContext(ctx, "release lease", slog.Any("error", err))
	} else {
		log.InfoContext(ctx, "lease released")
	}
}

// keepLease renews the lease every LeaseRenewInterval and cancels held
// when the lease is lost or cannot be renewed before it runs out.
func (r *Relay) keepLease(held context.Context, lose context.CancelCauseFunc, epoch int64, log *slog.Logger) {
	t := time.NewTicker(r.cfg.LeaseRenewInterval)
	defer t.Stop()
	for {
		remaining := r.lease.Remaining()
		if remaining <= 0 {
			r.m.errors.WithLabelValues(errKindLease).Inc()
			log.Error("lease ran out before it could be renewed: stopping publishing")
			lose(ErrLeadershipLost)
			return
		}
		expire := time.NewTimer(remaining)
		select {
		case <-held.Done():
			expire.Stop()
			return
		case <-expire.C:
			continue
		case <-t.C:
			expire.Stop()
		}
		ok, err := r.lease.Renew(held, epoch, remaining)
		switch {
		case held.Err() != nil:
			return
		case err != nil:
			r.setReady(fmt.Errorf("renew lease: %w", err))
			r.m.errors.WithLabelValues(errKindLease).Inc()
			log.Warn("renew lease", slog.Any("error", err))
		case !ok:
			r.m.errors.WithLabelValues(errKindLease).Inc()
			log.Error("lease lost: another relay holds it now: stopping publishing")
			lose(ErrLeadershipLost)
			return
		default:
			r.setReady(nil)
		}
	}
}

// retry runs f until it succeeds or ctx ends, with backoff.
func (r *Relay) retry(ctx context.Context, kind, what string, f func() error) error {
	bo := newBackoff(r.cfg.BackoffMax)
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

func newBackoff(maxInterval time.Duration) *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = maxInterval
	bo.MaxElapsedTime = 0
	bo.Reset()
	return bo
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
