package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/failpoint"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// Failpoints (see internal/failpoint) the fault tests arm to kill the relay
// at the two moments that matter for R3.
const (
	FailpointBeforeKafkaCommit = "relay-before-kafka-commit"
	FailpointAfterKafkaCommit  = "relay-after-kafka-commit"
)

// Relay publishes the outbox to Kafka. Several relays may run against one
// database: the one holding the shard's lease publishes, the others stand by.
type Relay struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	txnID string
	start time.Time

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
		txnID:  cfg.TransactionalIDPrefix + cfg.Shard,
		start:  time.Now(),
		tracer: tracer(cfg.TracerProvider),
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
// and the lease released.
func (r *Relay) Run(ctx context.Context) error {
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
	for {
		epoch, err := r.acquire(ctx)
		if err != nil {
			return nil // ctx cancelled
		}
		err = r.lead(ctx, epoch)
		if ctx.Err() != nil {
			r.log.InfoContext(ctx, "relay stopped")
			return nil
		}
		r.log.WarnContext(ctx, "leadership ended, standing by", slog.Any("error", err))
	}
}

// acquire waits until this relay holds the lease and returns its epoch.
func (r *Relay) acquire(ctx context.Context) (int64, error) {
	logged := false
	for {
		t0 := time.Since(r.start)
		var epoch int64
		qctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL)
		err := r.cfg.DB.QueryRow(qctx, acquireLeaseSQL, r.cfg.Shard, r.cfg.HolderID, r.cfg.LeaseTTL.Seconds()).Scan(&epoch)
		cancel()
		switch {
		case err == nil:
			r.setReady(nil)
			r.validUntil.Store(int64(t0 + r.cfg.LeaseTTL))
			return epoch, nil
		case errors.Is(err, pgx.ErrNoRows):
			r.setReady(nil)
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

func (r *Relay) leaseValid() bool { return time.Since(r.start) < time.Duration(r.validUntil.Load()) }

// lead publishes until ctx is cancelled (graceful stop) or the lease is lost.
func (r *Relay) lead(ctx context.Context, epoch int64) error {
	log := r.log.With(slog.Int64("epoch", epoch))
	log.InfoContext(ctx, "leadership acquired", slog.String("transactional_id", r.txnID))
	r.leader.Store(true)
	r.m.isLeader.Set(1)

	leaseCtx, lose := context.WithCancelCause(context.Background())
	var wg sync.WaitGroup
	defer func() {
		r.leader.Store(false)
		r.m.isLeader.Set(0)
		lose(nil)
		wg.Wait()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if _, err := r.cfg.DB.Exec(rctx, releaseLeaseSQL, r.cfg.Shard, r.cfg.HolderID, epoch); err != nil {
			log.WarnContext(ctx, "release lease", slog.Any("error", err))
		} else {
			log.InfoContext(ctx, "lease released")
		}
	}()
	wake := make(chan struct{}, 1)
	if r.cfg.Listen {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(leaseCtx, wake, log) }()
	}
	wg.Add(3)
	go func() { defer wg.Done(); r.renewLoop(leaseCtx, lose, epoch, log) }()
	go func() { defer wg.Done(); r.every(leaseCtx, r.cfg.StatsInterval, r.stats) }()
	go func() { defer wg.Done(); r.every(leaseCtx, r.cfg.PruneInterval, r.prune) }()

	// stop ends waits: a graceful stop or a lost lease.
	stop, stopCancel := context.WithCancel(ctx)
	defer stopCancel()
	go func() {
		select {
		case <-leaseCtx.Done():
			stopCancel()
		case <-stop.Done():
		}
	}()

	// In-flight work runs under opCtx, which a graceful stop does not
	// cancel: a batch whose Kafka transaction began is committed (or
	// aborted) and marked before Run returns.
	opCtx := context.WithoutCancel(ctx)
	var cl *kgo.Client
	defer func() {
		if cl != nil {
			cl.Close()
		}
	}()
	bo := r.newBackoff()
	// failAt logs with lctx: a failed transaction's log line carries its
	// span's trace_id.
	failAt := func(lctx context.Context, kind, what string, err error) {
		r.m.errors.WithLabelValues(kind).Inc()
		log.ErrorContext(lctx, what, slog.String("kind", kind), slog.Any("error", err))
		_ = sleep(stop, bo.NextBackOff())
	}
	fail := func(kind, what string, err error) { failAt(ctx, kind, what, err) }

	// The mark of batch N runs while batch N+1 is fetched and published.
	// Batch N+1's checkpoint names both batches, and batch N+2 starts only
	// after N's mark finished, so the last committed checkpoint always
	// covers every row that may be on Kafka but unmarked.
	type markJob struct {
		ids  []int64
		done chan error
	}
	var inflight *markJob
	waitMark := func() error {
		if inflight == nil {
			return nil
		}
		err := <-inflight.done
		inflight = nil
		if err != nil {
			return fmt.Errorf("mark batch published: %w", err)
		}
		return nil
	}
	defer func() { _ = waitMark() }()
	reset := func() { // throw the producer away: the next round recovers
		_ = waitMark()
		if cl != nil {
			cl.Close()
			cl = nil
		}
	}
	for {
		if ctx.Err() != nil {
			return nil
		}
		if err := context.Cause(leaseCtx); err != nil || !r.leaseValid() {
			return ErrLeadershipLost
		}
		if cl == nil {
			c, err := r.recover(stop, log)
			if err != nil {
				if stop.Err() == nil {
					fail(errKindCheckpoint, "recover from checkpoint", err)
				}
				continue
			}
			cl = c
		}
		var unmarked []int64
		if inflight != nil {
			unmarked = inflight.ids
		}
		tFetch := time.Now()
		rows, err := r.fetch(stop, unmarked)
		if err != nil {
			if stop.Err() == nil {
				fail(errKindPostgres, "read outbox", err)
			}
			continue
		}
		if len(rows) == 0 {
			if inflight != nil {
				if err := waitMark(); err != nil {
					reset()
					fail(errKindPostgres, "mark batch published", err)
				}
				continue
			}
			bo.Reset()
			t := time.NewTimer(r.cfg.PollInterval)
			select {
			case <-stop.Done():
			case <-t.C:
			case <-wake:
			}
			t.Stop()
			continue
		}
		if err := r.checkTopics(stop, rows); err != nil {
			if stop.Err() == nil {
				fail(errKindTopic, "topic breaks its contract: not publishing to it (the row is never skipped)", err)
			}
			continue
		}
		tPublish := time.Now()
		txn := r.startTxn(opCtx, rows, len(unmarked))
		err = r.publish(txn.ctx, cl, rows, unmarked)
		txn.end(err)
		if err != nil {
			// Whatever happened, the producer is thrown away and the next
			// round recovers through the checkpoint: a new producer with
			// the same transactional.id completes or aborts whatever this
			// one left, and the checkpoint says what committed.
			reset()
			var te *TopicError
			switch {
			case errors.Is(err, ErrLeadershipLost):
				return err
			case errors.As(err, &te):
				failAt(txn.ctx, errKindTopic, "publish batch: topic is missing or unwritable, retrying (the row is never skipped)", err)
			case errors.Is(err, errUnknownOutcome):
				failAt(txn.ctx, errKindUnknown, "publish batch: commit outcome unknown, recovering from checkpoint", err)
			default:
				failAt(txn.ctx, errKindKafka, "publish batch", err)
			}
			continue
		}
		failpoint.Hit(FailpointAfterKafkaCommit)
		tMark := time.Now()
		if err := waitMark(); err != nil {
			// Both batches are on Kafka; this batch's checkpoint names both.
			reset()
			fail(errKindPostgres, "mark batch published", err)
			continue
		}
		ids := make([]int64, len(rows))
		for i, w := range rows {
			ids[i] = w.id
		}
		job := &markJob{ids: ids, done: make(chan error, 1)}
		go func() { job.done <- r.mark(opCtx, job.ids) }()
		inflight = job
		if log.Enabled(ctx, slog.LevelDebug) {
			log.DebugContext(txn.ctx, "batch published", slog.Int("rows", len(rows)),
				slog.Duration("fetch", tPublish.Sub(tFetch)), slog.Duration("kafka", tMark.Sub(tPublish)),
				slog.Duration("previous_mark_wait", time.Since(tMark)))
		}
		bo.Reset()
	}
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
		tag, err := r.cfg.DB.Exec(qctx, renewLeaseSQL, r.cfg.Shard, r.cfg.HolderID, epoch, r.cfg.LeaseTTL.Seconds())
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
	var n int64
	var age float64
	if err := r.cfg.DB.QueryRow(ctx, statsSQL).Scan(&n, &age); err != nil {
		return fmt.Errorf("count pending rows: %w", err)
	}
	r.m.pending.Set(float64(n))
	r.m.oldestAge.Set(age)
	return nil
}

// prune deletes published rows older than the retention in small batches,
// at most 100 batches per call so that it yields to the publisher's
// connection use; under steady load it keeps up as long as one call deletes
// more than PruneInterval's worth of published rows.
func (r *Relay) prune(ctx context.Context) error {
	retention := max(r.cfg.Retention, 0).Seconds()
	for range 100 {
		tag, err := r.cfg.DB.Exec(ctx, pruneSQL, retention, r.cfg.PruneBatchRows)
		if err != nil {
			return fmt.Errorf("prune outbox: %w", err)
		}
		r.m.pruned.Add(float64(tag.RowsAffected()))
		if tag.RowsAffected() < int64(r.cfg.PruneBatchRows) {
			return nil
		}
	}
	return nil
}

// recover builds a new transactional producer and finishes the last batch:
// initialising the transactional.id fences any older producer with it and
// completes or aborts its pending transaction; then the last committed
// checkpoint's ids are marked published. Only the last two batches can be
// on Kafka but unmarked (batch N's mark finishes before batch N+2 begins),
// and the last checkpoint names both.
func (r *Relay) recover(ctx context.Context, log *slog.Logger) (*kgo.Client, error) {
	opts := append(slices.Clone(r.cfg.KafkaOpts),
		kgo.TransactionalID(r.txnID),
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
	ictx, cancel := context.WithTimeout(ctx, r.cfg.TransactionTimeout+5*time.Second)
	defer cancel()
	if _, _, err := cl.ProducerID(ictx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("init transactional id %q: %w", r.txnID, err)
	}
	ids, err := readCheckpoint(ictx, r.cfg.KafkaOpts, r.cfg.CheckpointTopic, r.cfg.Shard)
	if err != nil {
		cl.Close()
		return nil, err
	}
	var marked int64
	if len(ids) > 0 {
		tag, err := r.cfg.DB.Exec(ictx, r.markSQL(), ids)
		if err != nil {
			cl.Close()
			return nil, fmt.Errorf("mark checkpointed rows: %w", err)
		}
		marked = tag.RowsAffected()
	}
	r.recovered = &recovery{checkpointIDs: len(ids), marked: marked}
	log.InfoContext(ctx, "producer ready, recovered from checkpoint",
		slog.Int("checkpoint_ids", len(ids)), slog.Int64("marked", marked))
	return cl, nil
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
}

// fetch reads the next batch, bounded by BatchMaxRows and BatchMaxBytes.
func (r *Relay) fetch(ctx context.Context, exclude []int64) ([]row, error) {
	if exclude == nil {
		exclude = []int64{}
	}
	rs, err := r.cfg.DB.Query(ctx, selectBatchSQL, r.cfg.BatchMaxRows, exclude)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []row
	bytes := 0
	for rs.Next() {
		var w row
		var hs []byte
		if err := rs.Scan(&w.id, &w.eventID, &w.topic, &w.source, &w.seq, &w.eventType, &w.contentType, &w.key, &hs, &w.payload); err != nil {
			return nil, err
		}
		if len(hs) > 2 {
			if err := json.Unmarshal(hs, &w.headers); err != nil {
				return nil, fmt.Errorf("outbox row %d: headers: %w", w.id, err)
			}
		}
		size := len(w.payload) + len(w.key) + len(w.eventID) + len(w.source) + len(hs) + 64
		if len(out) > 0 && bytes+size > r.cfg.BatchMaxBytes {
			break
		}
		bytes += size
		out = append(out, w)
	}
	return out, rs.Err()
}

var errUnknownOutcome = errors.New("kafka transaction outcome unknown")

// publish writes rows and their checkpoint record in one Kafka transaction
// and commits it. A nil error means committed.
func (r *Relay) publish(ctx context.Context, cl *kgo.Client, rows []row, unmarked []int64) error {
	if !r.leaseValid() {
		return ErrLeadershipLost
	}
	begun := time.Now()
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	recs := make([]*kgo.Record, 0, len(rows)+1)
	ids := make([]int64, len(rows))
	for i, w := range rows {
		ids[i] = w.id
		env := envelope.Envelope{
			EventID: w.eventID, Source: w.source, Seq: w.seq, EventType: w.eventType,
			ContentType: w.contentType, Key: w.key, Payload: w.payload,
		}
		if tp, ok := w.headers[envelope.HeaderTraceparent]; ok {
			env.Traceparent = tp
			delete(w.headers, envelope.HeaderTraceparent)
		}
		env.Headers = w.headers
		recs = append(recs, env.Record(w.topic))
	}
	// The checkpoint names every id that may be on Kafka but unmarked once
	// this transaction commits: this batch and the previous one, whose mark
	// is still running.
	ckpt := append(slices.Clone(unmarked), ids...)
	recs = append(recs, &kgo.Record{Topic: r.cfg.CheckpointTopic, Key: []byte(r.cfg.Shard), Value: encodeIDs(ckpt)})

	pctx, cancel := context.WithTimeout(ctx, r.cfg.TransactionTimeout)
	defer cancel()
	var produceErr error
	for _, res := range cl.ProduceSync(pctx, recs...) {
		if res.Err != nil {
			if isTopicMissing(res.Err) {
				produceErr = &TopicError{Topic: res.Record.Topic, Err: res.Err}
			} else {
				produceErr = fmt.Errorf("produce to %q: %w", res.Record.Topic, res.Err)
			}
			break
		}
	}
	failpoint.Hit(FailpointBeforeKafkaCommit)
	if produceErr == nil && !r.leaseValid() {
		produceErr = ErrLeadershipLost
	}
	if produceErr != nil {
		// Abort; any error here leaves the outcome to the next producer's
		// initialisation, which aborts the transaction for certain.
		if err := cl.AbortBufferedRecords(pctx); err != nil {
			return errors.Join(produceErr, fmt.Errorf("abort buffered records: %w", err))
		}
		if err := cl.EndTransaction(pctx, kgo.TryAbort); err != nil {
			return errors.Join(produceErr, fmt.Errorf("abort transaction: %w", err))
		}
		return produceErr
	}
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
		_, err := r.cfg.DB.Exec(mctx, r.markSQL(), ids)
		if err != nil && mctx.Err() != nil {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(bo, mctx))
}

func (r *Relay) markSQL() string {
	if r.cfg.DeleteOnPublish {
		return deletePublishedSQL
	}
	return markPublishedSQL
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
// publish to it. A topic that fails stays unchecked and blocks the batch: it
// is retried with backoff, and its rows are never skipped.
func (r *Relay) checkTopics(ctx context.Context, rows []row) error {
	if r.cfg.TopicCheck == nil {
		return nil
	}
	if r.checked == nil {
		r.checked = map[string]bool{}
	}
	for _, w := range rows {
		if r.checked[w.topic] {
			continue
		}
		if err := r.cfg.TopicCheck(ctx, w.topic); err != nil {
			return &TopicError{Topic: w.topic, Err: err}
		}
		r.checked[w.topic] = true
	}
	return nil
}
