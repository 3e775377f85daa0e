package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/failpoint"
)

// Consumer is the consumer engine: a Kafka consumer group member that applies
// each partition's records, in order, through the inbox. Build it with New
// and start it with Run.
type Consumer struct {
	cfg Config
	app *applier
	m   *metrics
	log *slog.Logger

	running atomic.Bool
	// degraded holds the last infrastructure error (nil when healthy).
	degraded atomic.Pointer[error]

	mu      sync.Mutex
	workers map[tp]*worker
	cl      *kgo.Client
	baseCtx context.Context
}

type tp struct {
	topic     string
	partition int32
}

// fetched is one partition's records from one poll.
type fetched struct {
	recs []*kgo.Record
	hw   int64
}

// worker applies one partition's batches in order.
type worker struct {
	tp tp
	// expectDups is set while batches are all redeliveries (it starts set:
	// redelivery follows reassignment); then a batch is first probed
	// read-only.
	expectDups bool
	in         chan fetched
	stop       chan struct{}
	done       chan struct{}
}

// New checks cfg (after WithDefaults) and returns a consumer. It does not
// connect to anything; Run does.
func New(cfg Config) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h := cfg.BatchHandler
	if h == nil {
		h = asBatch(cfg.Handler)
	}
	c := &Consumer{
		cfg:     cfg,
		m:       newMetrics(cfg.Registerer),
		log:     cfg.Logger,
		workers: map[tp]*worker{},
	}
	c.cfg.setGuard()
	c.app = &applier{cfg: &c.cfg, handler: h, tr: newTracing(&c.cfg)}
	return c, nil
}

// Ready reports whether the consumer is running and its last batch did not
// fail on infrastructure (Postgres unreachable, …). A member without
// partitions (more replicas than partitions) is ready too, so that a rollout
// does not wait for it.
func (c *Consumer) Ready() error {
	if !c.running.Load() {
		return errors.New("not running")
	}
	if p := c.degraded.Load(); p != nil {
		return *p
	}
	return nil
}

// Run consumes until ctx ends, then drains: every partition's in-flight
// batch is finished and committed, the group is left, and Run returns nil.
// It returns an error only when the Kafka client cannot be created.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)
	c.baseCtx = context.WithoutCancel(ctx)

	opts := append([]kgo.Opt{}, c.cfg.KafkaOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Only offsets whose batch committed in Postgres are marked; marked
		// offsets are committed every CommitInterval and on revocation.
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(c.cfg.CommitInterval),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.AdjustFetchOffsetsFn(c.adjustOffsets),
	)
	if c.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(c.cfg.InstanceID))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	c.mu.Lock()
	c.cl = cl
	c.mu.Unlock()
	c.log.InfoContext(ctx, "consumer started", "group", c.cfg.Group, "topics", c.cfg.Topics, "consumer", c.cfg.ConsumerName,
		"ordering", c.cfg.Ordering.String())

	// The gap timer runs in every replica until Run returns.
	timerCtx, stopTimer := context.WithCancel(ctx)
	timerDone := make(chan struct{})
	if sg, ok := c.cfg.guard.(*seqGuard); ok {
		go func() {
			defer close(timerDone)
			c.runGapTimer(timerCtx, sg)
		}()
	} else {
		close(timerDone)
	}
	defer func() {
		stopTimer()
		<-timerDone
	}()

	fetchBackoff := backoff.NewExponentialBackOff(backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	for ctx.Err() == nil {
		fs := cl.PollRecords(ctx, 10*c.cfg.BatchMaxRecords)
		if fs.IsClientClosed() || ctx.Err() != nil {
			break
		}
		fetchErrs := 0
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				fetchErrs++
				c.log.WarnContext(ctx, "fetch error", "topic", t, "partition", p, "error", err)
			}
		})
		if fetchErrs > 0 && fs.NumRecords() == 0 {
			// Errors without records (e.g. a missing topic, no ACL): back
			// off instead of spinning on the poll.
			if err := sleepCtx(ctx, fetchBackoff.NextBackOff()); err != nil {
				break
			}
			continue
		}
		fetchBackoff.Reset()
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			c.mu.Lock()
			w := c.workers[tp{p.Topic, p.Partition}]
			c.mu.Unlock()
			if w == nil {
				return // revoked since the fetch; the next owner reads it again
			}
			select {
			case w.in <- fetched{recs: p.Records, hw: p.HighWatermark}:
			case <-w.stop:
			case <-ctx.Done():
			}
		})
	}
	// Drain: every worker finishes its in-flight batch, the offsets of what
	// committed in Postgres are committed to Kafka, then Close leaves the
	// group (a static member keeps its partitions until its session times
	// out, so that its restart takes them back without a rebalance).
	c.log.InfoContext(c.baseCtx, "consumer draining")
	c.stopWorkers(nil)
	c.commitMarked(cl)
	cl.Close()
	c.stopWorkers(nil) // none left unless a callback raced the close
	c.log.InfoContext(c.baseCtx, "consumer stopped")
	return nil
}

func (c *Consumer) onAssigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, parts := range assigned {
		for _, p := range parts {
			k := tp{topic, p}
			if c.workers[k] != nil {
				continue
			}
			w := &worker{tp: k, expectDups: true, in: make(chan fetched, c.cfg.QueueDepth), stop: make(chan struct{}), done: make(chan struct{})}
			c.workers[k] = w
			go c.runWorker(cl, w)
		}
	}
	c.log.Info("partitions assigned", "partitions", fmtParts(assigned))
}

func (c *Consumer) onRevoked(_ context.Context, cl *kgo.Client, revoked map[string][]int32) {
	if len(revoked) == 0 {
		return
	}
	c.stopWorkers(revoked)
	c.commitMarked(cl)
	c.log.Info("partitions revoked", "partitions", fmtParts(revoked))
}

func (c *Consumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.stopWorkers(lost)
	c.log.Warn("partitions lost", "partitions", fmtParts(lost))
}

// stopWorkers stops the workers of parts (all when parts is nil) and waits
// for each to finish its in-flight batch.
func (c *Consumer) stopWorkers(parts map[string][]int32) {
	c.mu.Lock()
	var ws []*worker
	if parts == nil {
		for k, w := range c.workers {
			ws = append(ws, w)
			delete(c.workers, k)
		}
	} else {
		for topic, ps := range parts {
			for _, p := range ps {
				k := tp{topic, p}
				if w := c.workers[k]; w != nil {
					ws = append(ws, w)
					delete(c.workers, k)
				}
			}
		}
	}
	c.mu.Unlock()
	for _, w := range ws {
		close(w.stop)
	}
	for _, w := range ws {
		<-w.done
		c.m.dropLag(w.tp.topic, w.tp.partition)
	}
}

// adjustOffsets seeks each newly assigned partition to the next offset
// stored in Postgres when that is ahead of Kafka's committed offset: the
// batch that committed in Postgres but whose Kafka commit was lost is not
// fetched again.
func (c *Consumer) adjustOffsets(ctx context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	topics := make([]string, 0, len(offs))
	for t := range offs {
		topics = append(topics, t)
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := c.cfg.Pool.Query(qctx, qLoadOffsets, c.cfg.Group, topics)
	if err != nil {
		// Not fatal: Kafka's committed offsets are safe, only less precise.
		c.log.Warn("load stored offsets", "error", err)
		return offs, nil
	}
	defer rows.Close()
	for rows.Next() {
		var topic string
		var part int32
		var next int64
		if err := rows.Scan(&topic, &part, &next); err != nil {
			c.log.Warn("load stored offsets", "error", err)
			return offs, nil
		}
		cur, ok := offs[topic][part]
		if !ok {
			continue
		}
		if next > cur.EpochOffset().Offset {
			offs[topic][part] = kgo.NewOffset().At(next).WithEpoch(-1)
			c.log.Info("seek to stored offset", "topic", topic, "partition", part,
				"kafka_offset", cur.EpochOffset().Offset, "stored_offset", next)
		}
	}
	if err := rows.Err(); err != nil {
		c.log.Warn("load stored offsets", "error", err)
	}
	return offs, nil
}

func (c *Consumer) runWorker(cl *kgo.Client, w *worker) {
	defer close(w.done)
	for {
		select {
		case <-w.stop:
			return
		case f := <-w.in:
			for start := 0; start < len(f.recs); start += c.cfg.BatchMaxRecords {
				select {
				case <-w.stop:
					return // the rest is not committed: the next owner reads it
				default:
				}
				end := min(start+c.cfg.BatchMaxRecords, len(f.recs))
				if err := c.processBatch(cl, w, f.recs[start:end]); err != nil {
					return // stopped while retrying
				}
				c.m.setLag(w.tp.topic, w.tp.partition, f.hw-(f.recs[end-1].Offset+1))
			}
		}
	}
}

// processBatch applies one batch and commits its offset to Kafka. It
// retries infrastructure errors until they pass or the worker is stopped.
func (c *Consumer) processBatch(cl *kgo.Client, w *worker, recs []*kgo.Record) (err error) {
	ctx := c.baseCtx
	start := time.Now()
	c.m.inFlight.Inc()
	defer c.m.inFlight.Dec()
	items := make([]item, len(recs))
	for i, r := range recs {
		items[i] = decodeItem(r, c.cfg.MaxPayloadBytes)
	}
	c.app.tr.startProcess(ctx, items)
	defer func() { c.app.tr.endProcess(items, err) }()
	b := backoff.NewExponentialBackOff(backoff.WithMaxInterval(10*time.Second), backoff.WithMaxElapsedTime(0))
	var out outcome
	for {
		var err error
		if w.expectDups {
			var known bool
			known, err = c.app.allKnown(ctx, items)
			if err == nil && known {
				out = outcome{duplicates: len(items)}
				for i := range items {
					items[i].result = outcomeDuplicate
				}
				break
			}
			w.expectDups = false
		}
		out, err = c.app.withTimeout(ctx, func(ctx context.Context) (outcome, error) { return c.app.applyTx(ctx, items) })
		var he *HandlerError
		if errors.As(err, &he) {
			c.m.handlerErrors.Inc()
			c.log.WarnContext(ctx, "batch handler failed, applying one event per transaction",
				"topic", w.tp.topic, "partition", w.tp.partition, "records", len(items), "error", err)
			out, err = c.app.applyIsolated(ctx, items, w.stop, func(error) { c.m.handlerErrors.Inc() })
		}
		if err == nil {
			c.degraded.Store(nil)
			break
		}
		if errors.Is(err, errStopped) {
			return err
		}
		c.degraded.Store(&err)
		wait := b.NextBackOff()
		c.log.ErrorContext(ctx, "apply batch", "topic", w.tp.topic, "partition", w.tp.partition,
			"first_offset", recs[0].Offset, "retry_in", wait, "error", err)
		if err := sleep(wait, w.stop); err != nil {
			return err
		}
	}
	w.expectDups = out.duplicates == len(items)
	c.m.processed.Add(float64(out.processed))
	c.m.duplicates.Add(float64(out.duplicates))
	c.m.deadLettered.Add(float64(out.dead))
	c.m.malformed.Add(float64(out.malformed))
	c.m.batchSize.Observe(float64(len(recs)))
	c.m.addGuard(out.guard)
	c.logGivenUp(ctx, out.guard.givenUp)

	failpoint.Hit(fpAfterPGCommit)
	c.copyToDLQ(ctx, cl, out.deadItems)
	// The Kafka commit follows (every CommitInterval, and on revocation).
	cl.MarkCommitRecords(recs[len(recs)-1])
	c.m.batchDuration.Observe(time.Since(start).Seconds())
	if out.dead > 0 || out.duplicates > 0 {
		c.log.DebugContext(ctx, "batch applied", "topic", w.tp.topic, "partition", w.tp.partition,
			"processed", out.processed, "duplicates", out.duplicates, "dead_lettered", out.dead)
	}
	return nil
}

// commitMarked commits the marked offsets to Kafka now. A failure is
// logged and harmless: the next offsets are in Postgres too.
func (c *Consumer) commitMarked(cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(c.baseCtx, c.cfg.CommitTimeout)
	defer cancel()
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		c.log.Warn("commit offsets to kafka", "error", err)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// DLQErrorHeader carries the reason on a record copied to the DLQ topic.
const DLQErrorHeader = "onceflow-error"

func (c *Consumer) copyToDLQ(ctx context.Context, cl *kgo.Client, dead []deadLetter) {
	if c.cfg.DLQTopic == "" || len(dead) == 0 {
		return
	}
	recs := make([]*kgo.Record, 0, len(dead))
	for _, d := range dead {
		hs := append([]kgo.RecordHeader{}, d.rec.Headers...)
		hs = append(hs,
			kgo.RecordHeader{Key: DLQErrorHeader, Value: []byte(d.reason)},
			kgo.RecordHeader{Key: "onceflow-origin", Value: fmt.Appendf(nil, "%s/%d@%d", d.rec.Topic, d.rec.Partition, d.rec.Offset)},
		)
		recs = append(recs, &kgo.Record{Topic: c.cfg.DLQTopic, Key: d.rec.Key, Value: d.rec.Value, Headers: hs})
	}
	pctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	defer cancel()
	if err := cl.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		c.log.WarnContext(ctx, "copy dead letters to DLQ topic (the inbox rows are kept)", "topic", c.cfg.DLQTopic, "error", err)
	}
}

func fmtParts(m map[string][]int32) string {
	s := ""
	for t, ps := range m {
		if s != "" {
			s += " "
		}
		s += fmt.Sprintf("%s%v", t, ps)
	}
	return s
}
