package inbox

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/schema"
	"github.com/onceflow/onceflow/pkg/wire"
)

// Consumer is the consumer engine: a Kafka consumer group member that applies
// each partition's records, in order, through the inbox. Build it with New
// and start it with Run.
type Consumer struct {
	cfg Config
	// wire decodes records of every wire format into the JSON view.
	wire *wire.Decoder
	app  *applier
	m    *metrics
	log  *slog.Logger

	running atomic.Bool
	// degraded holds the last infrastructure error (nil when healthy).
	degraded atomic.Pointer[error]

	mu      sync.Mutex
	workers map[tp]*worker
	// gen counts assignment changes (assigned, revoked, lost). A worker
	// remembers the gen it was created at and a poll the gen it returned
	// at: a batch reaches only a worker that existed when it was polled.
	gen     uint64
	cl      *kgo.Client
	baseCtx context.Context
	// resubscribed is when a recreated topic was last purged and re-added
	// (poll loop only).
	resubscribed map[string]time.Time
}

type tp struct {
	topic     string
	partition int32
}

// fetched is one partition's records from one poll.
type fetched struct {
	recs []*kgo.Record
	hw   int64
	// topicID is the Kafka topic ID the records were fetched from; the
	// partition's next offset is stored under it.
	topicID [16]byte
	// gen is the assignment gen when the poll returned them.
	gen uint64
}

// worker applies one partition's batches in order.
type worker struct {
	tp tp
	// gen is the assignment gen the worker was created at.
	gen uint64
	// expectDups is set while batches are all redeliveries (it starts set:
	// redelivery follows reassignment); then a batch is first probed
	// read-only.
	expectDups bool

	// The queue: the poll loop appends without blocking (so that it can
	// hand every polled batch to its worker before it allows a rebalance);
	// past QueueDepth batches the partition's fetching is paused, and the
	// worker resumes it when the queue drains.
	mu     sync.Mutex
	queue  []fetched
	paused bool
	wake   chan struct{}

	stop chan struct{}
	done chan struct{}
}

func newWorker(k tp, gen uint64) *worker {
	return &worker{tp: k, gen: gen, expectDups: true, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
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
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	c := &Consumer{
		cfg:          cfg,
		m:            m,
		log:          cfg.Logger,
		workers:      map[tp]*worker{},
		resubscribed: map[string]time.Time{},
		// A CloudEvent without the sequence extension has no seq: ordered
		// by arrival it gets its offset+1 (ignored there); ordered by seq
		// it is malformed.
		wire: &wire.Decoder{Registry: cfg.SchemaRegistry, SeqFromOffset: cfg.Ordering == OrderArrival},
	}
	c.app = &applier{cfg: &c.cfg, handler: h, tr: newTracing(&c.cfg), eff: effecterOf(&c.cfg), owner: newOwner(&c.cfg)}
	c.app.guard = newGuard(&c.cfg)
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
	if err := schema.WaitReady(ctx, c.cfg.Pool, func(err error, wait time.Duration) {
		c.log.ErrorContext(ctx, "check schema", "error", err, "retry_in", wait)
	}); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	opts := append([]kgo.Opt{}, c.cfg.KafkaOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(c.cfg.StartAt.offset()),
		// No rebalance callback runs between a poll and AllowRebalance: every
		// polled batch is handed to the worker of the assignment it was
		// fetched under, never to the next owner's worker.
		kgo.BlockRebalanceOnPoll(),
		// Only offsets whose batch committed in Postgres are marked; marked
		// offsets are committed every CommitInterval and on revocation.
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(c.cfg.CommitInterval),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.AdjustFetchOffsetsFn(c.adjustOffsets),
		// What one fetch may bring bounds memory, not the backlog.
		kgo.FetchMaxBytes(c.cfg.FetchMaxBytes),
		kgo.FetchMaxPartitionBytes(c.cfg.FetchMaxPartitionBytes),
		kgo.FetchMaxWait(c.cfg.FetchMaxWait),
	)
	if c.cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(c.cfg.InstanceID))
	}
	if c.cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(c.cfg.SessionTimeout))
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
	sg, _ := c.app.guard.(*seqGuard) // nil under arrival ordering: the held effects gauges only
	go func() {
		defer close(timerDone)
		c.runGapTimer(timerCtx, sg)
	}()
	defer func() {
		stopTimer()
		<-timerDone
	}()

	fetchBackoff := backoff.NewExponentialBackOff(backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	for ctx.Err() == nil {
		fs := cl.PollRecords(ctx, 10*c.cfg.BatchMaxRecords)
		if fs.IsClientClosed() || ctx.Err() != nil {
			cl.AllowRebalance()
			break
		}
		fetchErrs := 0
		var recreated []string
		fs.EachError(func(t string, p int32, err error) {
			switch {
			case errors.Is(err, context.Canceled):
			case errors.Is(err, kerr.UnknownTopicID):
				// franz-go never follows a topic to a new ID: the topic was
				// deleted and recreated. Purge it and subscribe again.
				recreated = append(recreated, t)
			default:
				fetchErrs++
				c.log.WarnContext(ctx, "fetch error", "topic", t, "partition", p, "error", err)
			}
		})
		c.dispatch(pollGen(c), polled(fs))
		cl.AllowRebalance()
		c.resubscribe(ctx, cl, recreated)
		if (fetchErrs > 0 || len(recreated) > 0) && fs.NumRecords() == 0 {
			// Errors without records (e.g. a missing topic, no ACL): back
			// off instead of spinning on the poll.
			if err := sleepCtx(ctx, fetchBackoff.NextBackOff()); err != nil {
				break
			}
			continue
		}
		fetchBackoff.Reset()
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
	if c.cl == nil {
		c.cl = cl // a callback may run before Run has stored the client
	}
	c.mu.Unlock()
	for _, w := range c.addWorkers(assigned) {
		go c.runWorker(cl, w)
	}
	c.log.Info("partitions assigned", "partitions", fmtParts(assigned))
}

// addWorkers creates the workers of newly assigned partitions, at a new
// assignment gen, and returns them (not started).
func (c *Consumer) addWorkers(assigned map[string][]int32) []*worker {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	var ws []*worker
	for topic, parts := range assigned {
		for _, p := range parts {
			k := tp{topic, p}
			if c.workers[k] != nil {
				continue
			}
			w := newWorker(k, c.gen)
			c.workers[k] = w
			ws = append(ws, w)
		}
	}
	return ws
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
// for each to finish its in-flight batch. What they had queued is dropped:
// the next owner fetches it again from the committed offsets.
func (c *Consumer) stopWorkers(parts map[string][]int32) {
	ws := c.takeWorkers(parts)
	c.mu.Lock()
	cl := c.cl
	c.mu.Unlock()
	for _, w := range ws {
		close(w.stop)
	}
	for _, w := range ws {
		<-w.done
		c.m.dropLag(w.tp.topic, w.tp.partition)
		w.mu.Lock()
		if w.paused && cl != nil {
			// Pauses outlive assignments: a partition assigned again
			// must be fetched.
			cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
			w.paused = false
		}
		w.mu.Unlock()
	}
}

// takeWorkers removes the workers of parts (all when parts is nil) at a new
// assignment gen and returns them (still running).
func (c *Consumer) takeWorkers(parts map[string][]int32) []*worker {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
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
	return ws
}

// polledPartition is one partition's records of one poll.
type polledPartition struct {
	tp      tp
	topicID [16]byte
	recs    []*kgo.Record
	hw      int64
}

// polled lists the partitions of fs that have records.
func polled(fs kgo.Fetches) []polledPartition {
	var out []polledPartition
	fs.EachTopic(func(t kgo.FetchTopic) {
		for _, p := range t.Partitions {
			if len(p.Records) > 0 {
				out = append(out, polledPartition{tp: tp{t.Topic, p.Partition}, topicID: t.TopicID, recs: p.Records, hw: p.HighWatermark})
			}
		}
	})
	return out
}

// pollGen is the assignment gen now; called right after a poll returns
// (no rebalance callback can run until AllowRebalance).
func pollGen(c *Consumer) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// dispatch hands each partition's polled records to the worker that owned
// the partition when they were polled, without blocking. Records polled
// under an earlier assignment than their partition's current worker (or for
// a partition no longer assigned) are dropped: the current owner fetches
// from its own start offset, and a stale batch reaching it could store a
// next offset past records it never applied.
func (c *Consumer) dispatch(gen uint64, parts []polledPartition) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range parts {
		w := c.workers[p.tp]
		if w == nil || w.gen > gen {
			c.m.staleBatches.Inc()
			c.log.Warn("batch polled under an earlier assignment dropped", "topic", p.tp.topic, "partition", p.tp.partition,
				"first_offset", p.recs[0].Offset, "records", len(p.recs))
			continue
		}
		w.enqueue(c.cl, fetched{recs: p.recs, hw: p.hw, topicID: p.topicID, gen: gen}, c.cfg.QueueDepth)
	}
}

// enqueue appends f to the worker's queue, pausing the partition's fetching
// once QueueDepth batches wait.
func (w *worker) enqueue(cl *kgo.Client, f fetched, depth int) {
	w.mu.Lock()
	w.queue = append(w.queue, f)
	if len(w.queue) >= depth && !w.paused && cl != nil {
		w.paused = true
		cl.PauseFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// next takes the oldest queued batch and, while their records fit in
// maxRecords together, the batches queued behind it that were polled under
// the same assignment from the same topic ID: batches that waited for the
// worker are applied in one transaction instead of one each (a backlog of
// small polls costs one transaction's round trips and commit, not one per
// poll). It resumes the partition's fetching when the queue has room again;
// ok is false when the queue is empty.
func (w *worker) next(cl *kgo.Client, depth, maxRecords int) (f fetched, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) == 0 {
		return f, false
	}
	f = w.queue[0]
	w.queue[0] = fetched{}
	w.queue = w.queue[1:]
	for len(w.queue) > 0 {
		h := w.queue[0]
		if h.gen != f.gen || h.topicID != f.topicID || len(f.recs)+len(h.recs) > maxRecords {
			break
		}
		// A new slice: the polled slices belong to the client's fetch.
		f.recs = append(slices.Clip(f.recs), h.recs...)
		f.hw = h.hw
		w.queue[0] = fetched{}
		w.queue = w.queue[1:]
	}
	if w.paused && len(w.queue) < depth && cl != nil {
		w.paused = false
		cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
	return f, true
}

// resubscribe purges topics that were deleted and recreated from the client
// and subscribes to them again (at most every 10 s per topic): the group
// then revokes their partitions and assigns them again under the new topic
// ID, and the stored offsets of the old topic are ignored (adjustOffsets).
func (c *Consumer) resubscribe(ctx context.Context, cl *kgo.Client, topics []string) {
	var todo []string
	for _, t := range topics {
		if time.Since(c.resubscribed[t]) < 10*time.Second {
			continue
		}
		c.resubscribed[t] = time.Now()
		todo = append(todo, t)
	}
	if len(todo) == 0 {
		return
	}
	slices.Sort(todo)
	todo = slices.Compact(todo)
	c.m.topicsRecreated.Add(float64(len(todo)))
	c.log.WarnContext(ctx, "topic deleted and recreated: consuming its new instance from its committed offsets (or its start)",
		"topics", todo)
	cl.PurgeTopicsFromConsuming(todo...)
	cl.AddConsumeTopics(todo...)
}

// adjustOffsets seeks each newly assigned partition to the next offset
// stored in Postgres when that is ahead of Kafka's committed offset: the
// batch that committed in Postgres but whose Kafka commit was lost is not
// fetched again. A stored offset is used only when it names the topic's
// current ID (topic_id): a row written for an earlier instance of the topic
// (deleted and recreated since), or one without an ID (written before IDs
// were stored), is ignored with a WARN and counted. After a recreation the
// partition starts at the log's start (Kafka's committed offset may belong
// to the old instance too); a row without an ID leaves Kafka's committed
// offset, which only ever covers applied records. The next batch stores the
// current ID.
func (c *Consumer) adjustOffsets(ctx context.Context, offs map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	topics := make([]string, 0, len(offs))
	for t := range offs {
		topics = append(topics, t)
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ids := c.topicIDs(qctx, topics)
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
		var storedID *string
		if err := rows.Scan(&topic, &part, &next, &storedID); err != nil {
			c.log.Warn("load stored offsets", "error", err)
			return offs, nil
		}
		cur, ok := offs[topic][part]
		if !ok {
			continue
		}
		current := ids[topic]
		reason := ""
		switch {
		case current == "":
			reason = "topic_id_unknown"
		case storedID == nil:
			reason = "no_topic_id"
		case *storedID != current:
			reason = "other_topic_id"
		}
		if reason != "" {
			c.m.offsetsIgnored.WithLabelValues(reason).Inc()
			start := "kafka_committed"
			if reason == "other_topic_id" {
				// The topic was recreated since this progress was stored.
				// Kafka's committed offset may be the old instance's too
				// (brokers before 4.2 can keep it): only the log's start
				// cannot skip a record. What was applied already is a
				// duplicate in the inbox.
				offs[topic][part] = kgo.NewOffset().AtStart()
				start = "log_start"
			}
			c.log.Warn("stored offset ignored: it does not name this topic's current ID", "topic", topic, "partition", part,
				"stored_offset", next, "stored_topic_id", deref(storedID), "topic_id", current, "reason", reason,
				"kafka_offset", cur.EpochOffset().Offset, "start_from", start)
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

// topicIDs asks the cluster for the current IDs of topics (as topicIDText
// writes them); a topic missing from the answer has none.
func (c *Consumer) topicIDs(ctx context.Context, topics []string) map[string]string {
	c.mu.Lock()
	cl := c.cl
	c.mu.Unlock()
	out := map[string]string{}
	if cl == nil {
		return out
	}
	md, err := kadm.NewClient(cl).Metadata(ctx, topics...)
	if err != nil {
		c.log.Warn("read topic IDs", "error", err)
		return out
	}
	for name, t := range md.Topics {
		if t.Err == nil {
			out[name] = topicIDText(t.ID)
		}
	}
	return out
}

// topicIDText is a Kafka topic ID as Kafka's tools print it (URL-safe
// base64 without padding), "" for the zero ID (a cluster without IDs).
func topicIDText(id [16]byte) string {
	if id == ([16]byte{}) {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(id[:])
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func (c *Consumer) runWorker(cl *kgo.Client, w *worker) {
	defer close(w.done)
	for {
		f, ok := w.next(cl, c.cfg.QueueDepth, c.cfg.BatchMaxRecords)
		if !ok {
			select {
			case <-w.stop:
				return
			case <-w.wake:
				continue
			}
		}
		if f.gen < w.gen {
			// Cannot happen while dispatch checks the same; kept so that a
			// batch of an earlier assignment never applies here.
			c.m.staleBatches.Inc()
			continue
		}
		for start := 0; start < len(f.recs); start += c.cfg.BatchMaxRecords {
			select {
			case <-w.stop:
				return // the rest is not committed: the next owner reads it
			default:
			}
			end := min(start+c.cfg.BatchMaxRecords, len(f.recs))
			if err := c.processBatch(cl, w, f.recs[start:end], f.topicID); err != nil {
				return // stopped while retrying
			}
			c.m.setLag(w.tp.topic, w.tp.partition, f.hw-(f.recs[end-1].Offset+1))
		}
	}
}

// processBatch applies one batch and commits its offset to Kafka. It
// retries infrastructure errors until they pass or the worker is stopped.
func (c *Consumer) processBatch(cl *kgo.Client, w *worker, recs []*kgo.Record, topicID [16]byte) (err error) {
	ctx := c.baseCtx
	start := time.Now()
	c.m.inFlight.Inc()
	defer c.m.inFlight.Dec()
	items := make([]item, len(recs))
	id := topicIDText(topicID)
	for i, r := range recs {
		items[i] = decodeItem(ctx, c.wire, r, c.cfg.MaxPayloadBytes, id)
	}
	c.app.tr.startProcess(ctx, items)
	defer func() { c.app.tr.endProcess(items, err) }()
	b := backoff.NewExponentialBackOff(backoff.WithMaxInterval(10*time.Second), backoff.WithMaxElapsedTime(0))
	var out outcome
	// todo is what is applied: the batch, or its prefix when the worker was
	// stopped while the effects were made.
	todo, stopped, committed := items, false, false
	defer func() {
		if errors.Is(err, errStopped) && !committed {
			c.app.abandon(ctx, items) // stopped in a retry wait: nothing more commits here
		}
	}()
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
		// The effects of the events the guard will apply in order are made
		// first, holding no transaction (prepare.go); a stop meanwhile
		// leaves only a prefix of the batch to apply.
		n, err := c.app.prepare(ctx, items, w.stop)
		if err == nil && n < len(items) {
			if n == 0 {
				return errStopped
			}
			todo, stopped = items[:n], true
		}
		if err == nil {
			out, err = c.app.withTimeout(ctx, func(ctx context.Context) (outcome, error) { return c.app.applyTx(ctx, todo) })
		}
		var he *HandlerError
		if errors.As(err, &he) {
			c.m.handlerErrors.Inc()
			c.log.WarnContext(ctx, "batch handler failed, applying one event per transaction",
				"topic", w.tp.topic, "partition", w.tp.partition, "records", len(todo), "error", err)
			out, err = c.app.applyIsolated(ctx, todo, w.stop, func(error) { c.m.handlerErrors.Inc() })
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
			"first_offset", recs[0].Offset, "retry_in", wait.String(), "error", err)
		if err := sleep(wait, w.stop); err != nil {
			return err
		}
	}
	committed = true
	recs = recs[:len(todo)]
	w.expectDups = out.duplicates == len(todo)
	c.m.processed.Add(float64(out.processed))
	c.m.duplicates.Add(float64(out.duplicates))
	c.m.deadLettered.Add(float64(out.dead))
	c.m.malformed.Add(float64(out.malformed))
	c.m.batchSize.Observe(float64(len(recs)))
	c.m.addGuard(out.guard)
	c.logGivenUp(ctx, out.guard.givenUp, out.deadReleased)

	c.cfg.Hooks.afterPGCommit()
	c.notify(ctx, &out)
	c.copyToDLQ(ctx, cl, out.deadItems)
	// The Kafka commit follows (every CommitInterval, and on revocation).
	cl.MarkCommitRecords(recs[len(recs)-1])
	c.m.batchDuration.Observe(time.Since(start).Seconds())
	if out.dead > 0 || out.duplicates > 0 {
		c.log.DebugContext(ctx, "batch applied", "topic", w.tp.topic, "partition", w.tp.partition,
			"processed", out.processed, "duplicates", out.duplicates, "dead_lettered", out.dead)
	}
	if stopped {
		return errStopped // the rest of the batch is the next owner's
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
