package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/relay/internal/lease"
	"github.com/onceflow/onceflow/pkg/wire"
)

// maxSetAsideRetry caps the automatic retry interval of set-aside rows.
const maxSetAsideRetry = 10 * time.Minute

// publisher is one term as leader, from the lease's acquisition to a
// graceful stop or the lease's loss, and the only owner of the term's
// state: the producer, the batch being marked, the rows under suspicion,
// the sweep. Nothing else writes its fields; it runs on one goroutine (a
// batch's mark runs on another and reports on markJob.done).
//
// Three contexts govern it:
//   - the Run context (ctx in run and round) ends it gracefully;
//   - held is cancelled, with ErrLeadershipLost as its cause, when the lease
//     is lost;
//   - stop ends waits (polls, backoff, recovery, reads): either of the two
//     above.
//
// In-flight work runs under opCtx, which a graceful stop does not cancel: a
// batch whose Kafka transaction began is committed (or aborted) and marked
// before Run returns.
type publisher struct {
	cfg    Config
	log    *slog.Logger
	m      *metrics
	tracer trace.Tracer
	lease  *lease.Lease // read only: Valid
	rec    *recoverer
	topics *topicChecker
	epoch  int64

	held  context.Context
	stop  context.Context
	opCtx context.Context

	wake <-chan struct{} // LISTEN's wake-ups of the poll loop
	bo   *backoff.ExponentialBackOff
	// prod is the transactional producer; nil: the next round recovers.
	prod *producer
	// recovered is the last recovery, for the next transaction's span.
	recovered *recovery

	// suspects are rows a refused transaction named: each is published
	// alone next, and set aside if Kafka refuses it alone too.
	suspects map[int64]refused
	// inflight is the mark of the last published batch. The mark of batch
	// N runs while batch N+1 is fetched and published. Batch N+1's
	// checkpoint names both batches, and batch N+2 starts only after N's
	// mark finished, so the last committed checkpoint always covers every
	// row that may be on Kafka but unmarked.
	inflight *markJob
	// reader reads the batches and sweeps for unqueued rows (reader.go).
	reader *reader
	// inDoubt is the batch whose commit outcome was unknown, until the
	// next recovery settles it (indoubt.go).
	inDoubt *inDoubtBatch
}

func newPublisher(r *Relay, epoch int64, log *slog.Logger) *publisher {
	return &publisher{
		cfg:      r.cfg,
		log:      log,
		m:        r.m,
		tracer:   tracer(r.cfg.TracerProvider),
		lease:    r.lease,
		rec:      r.rec,
		topics:   r.topics,
		epoch:    epoch,
		suspects: map[int64]refused{},
		reader:   newReader(r.cfg, r.lay, r.m, log),
	}
}

// markJob is a batch's mark, running concurrently with the next batch.
type markJob struct {
	ids  []int64
	ckpt ckptSet
	done chan error
}

// run publishes round after round until ctx ends or held is cancelled, and
// on the way out waits for the last mark and closes the producer.
func (p *publisher) run(ctx, held context.Context, wake <-chan struct{}) error {
	stop, stopCancel := context.WithCancel(ctx)
	defer stopCancel()
	defer context.AfterFunc(held, stopCancel)()
	p.held, p.stop, p.opCtx, p.wake = held, stop, context.WithoutCancel(ctx), wake
	p.bo = newBackoff(p.cfg.BackoffMax)
	defer func() {
		if p.prod != nil {
			p.prod.cl.Close()
		}
	}()
	defer func() { _ = p.waitMark() }()
	for {
		if done, err := p.round(ctx); done {
			return err
		}
	}
}

// round is one turn of the publish loop: recover when there is no
// producer, read a batch, screen it, publish it and start its mark. It
// returns done with the error that ends the term (nil: a graceful stop);
// every other failure is counted, logged and backed off here, and the next
// round tries again.
func (p *publisher) round(ctx context.Context) (done bool, err error) {
	if ctx.Err() != nil {
		return true, nil
	}
	if err := context.Cause(p.held); err != nil || !p.lease.Valid() {
		return true, ErrLeadershipLost
	}
	if p.prod == nil {
		prod, err := p.rec.recover(p.stop, p.log, p.inDoubt)
		var ie *IdentityError
		if errors.As(err, &ie) {
			return true, err
		}
		if err != nil {
			if p.stop.Err() == nil {
				p.fail(ctx, errKindCheckpoint, "recover from checkpoint", err)
			}
			return false, nil
		}
		p.prod, p.recovered, p.inDoubt = prod, prod.recovered, nil
	}
	var unmarked []int64
	var unmarkedCkpt ckptSet
	if p.inflight != nil {
		unmarked, unmarkedCkpt = p.inflight.ids, p.inflight.ckpt
	}
	tFetch := time.Now()
	rows, err := p.reader.next(p.stop, unmarked)
	if err != nil {
		if p.stop.Err() == nil {
			p.fail(ctx, errKindPostgres, "read outbox", err)
		}
		return false, nil
	}
	if len(rows) == 0 {
		p.idle(ctx)
		return false, nil
	}
	if rows = p.screen(ctx, rows); len(rows) == 0 {
		return false, nil
	}
	if rows[0].retrying {
		// A set-aside row goes alone (isolate); claim it first, so that an
		// operator's skip and this retry cannot both happen.
		var id int64
		err := p.cfg.DB.QueryRow(p.stop, qSetAsideClaim, rows[0].id).Scan(&id)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			p.log.InfoContext(ctx, "set-aside row skipped (or no longer due) before its retry: not published", slog.Int64("outbox_id", rows[0].id))
			return false, nil
		case err != nil:
			if p.stop.Err() == nil {
				p.fail(ctx, errKindPostgres, "claim set-aside row for its retry", err)
			}
			return false, nil
		}
	}
	return p.publish(ctx, rows, unmarkedCkpt, tFetch)
}

// idle finishes the running mark, or else waits for the next poll (or a
// wake-up).
func (p *publisher) idle(ctx context.Context) {
	if p.inflight != nil {
		if err := p.waitMark(); err != nil {
			p.reset()
			p.fail(ctx, errKindPostgres, "mark batch published", err)
		}
		return
	}
	p.bo.Reset()
	t := time.NewTimer(p.cfg.PollInterval)
	select {
	case <-p.stop.Done():
	case <-t.C:
	case <-p.wake:
	}
	t.Stop()
}

// screen returns the part of rows to publish now (none: the round is
// over), setting aside what screening refuses (screen.go).
func (p *publisher) screen(ctx context.Context, rows []row) []row {
	if len(p.suspects) > 4*p.cfg.BatchMaxRows {
		clear(p.suspects) // bounded; a suspect forgotten is found again
	}
	v := screen(p.stop, p.cfg, p.topics, rows, p.suspects)
	switch {
	case v.setAside != "":
		if v.setAside == ReasonTopicContract {
			p.m.errors.WithLabelValues(errKindTopic).Inc()
		}
		p.setAside(ctx, v.row, v.setAside, v.err)
	case v.err != nil && p.stop.Err() == nil:
		p.fail(ctx, errKindTopic, "check topic against its contract (retrying; the batch waits)", v.err)
	}
	return v.rows
}

// publish commits rows in one Kafka transaction, then starts their mark
// once the previous batch's mark finished.
func (p *publisher) publish(ctx context.Context, rows []row, unmarkedCkpt ckptSet, tFetch time.Time) (done bool, err error) {
	log := p.log
	tPublish := time.Now()
	txn := p.startTxn(p.opCtx, rows, len(unmarkedCkpt.fps))
	err = p.transact(txn.ctx, rows, unmarkedCkpt)
	txn.end(err)
	if err != nil {
		// Whatever happened, the producer is thrown away and the next
		// round recovers through the checkpoint: a new producer with the
		// same transactional.id completes or aborts whatever this one
		// left, and the checkpoint says what committed.
		p.reset()
		var re *refusedError
		switch {
		case errors.Is(err, ErrLeadershipLost):
			return true, err
		case errors.As(err, &re):
			if len(rows) > 1 {
				// Refused in company: each suspect goes alone next, the
				// others go on in batches.
				for id, rf := range re.refused {
					p.suspects[id] = rf
				}
				log.WarnContext(txn.ctx, "publish batch: Kafka or the topic's schema refused records; trying them one by one", slog.Any("error", err))
				return false, nil
			}
			rf := re.refused[rows[0].id]
			if isTopicReason(rf.reason) {
				p.m.errors.WithLabelValues(errKindTopic).Inc()
			}
			p.setAside(ctx, rows[0], rf.reason, rf.err)
			delete(p.suspects, rows[0].id)
		case errors.Is(err, errUnknownOutcome):
			p.fail(txn.ctx, errKindUnknown, "publish batch: commit outcome unknown, recovering from checkpoint", err)
		default:
			p.fail(txn.ctx, errKindKafka, "publish batch", err)
		}
		return false, nil
	}
	p.cfg.Hooks.afterKafkaCommit()
	tMark := time.Now()
	if err := p.waitMark(); err != nil {
		// Both batches are on Kafka; this batch's checkpoint names both.
		p.reset()
		p.fail(ctx, errKindPostgres, "mark batch published", err)
		return false, nil
	}
	ids := make([]int64, len(rows))
	ckpt := newCkptSet(len(rows))
	for i, w := range rows {
		ids[i] = w.id
		ckpt.add(w)
		delete(p.suspects, w.id)
	}
	job := &markJob{ids: ids, ckpt: ckpt, done: make(chan error, 1)}
	go func() { job.done <- markRows(p.opCtx, p.cfg, job.ids) }()
	p.inflight = job
	if log.Enabled(ctx, slog.LevelDebug) {
		log.DebugContext(txn.ctx, "batch published", slog.Int("rows", len(rows)),
			slog.Duration("fetch", tPublish.Sub(tFetch)), slog.Duration("kafka", tMark.Sub(tPublish)),
			slog.Duration("previous_mark_wait", time.Since(tMark)))
	}
	p.bo.Reset()
	return false, nil
}

var errUnknownOutcome = errors.New("kafka transaction outcome unknown")

// transact writes rows and their checkpoint record in one Kafka transaction
// and commits it. A nil error means committed. A *refusedError means Kafka
// refused some records for good (and nothing was committed); unmarked are
// the ids and fingerprints of the previous batch, whose mark is running.
func (p *publisher) transact(ctx context.Context, rows []row, unmarked ckptSet) error {
	if !p.lease.Valid() {
		return ErrLeadershipLost
	}
	cl := p.prod.cl
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
	envs := make([]envelope.Envelope, len(rows))
	// One wall-clock stamp for the transaction's records (Config.Clock).
	stamp := p.cfg.now()
	for i, w := range rows {
		ckpt.add(w)
		env := envelope.Envelope{
			EventID: w.eventID, Source: w.source, Seq: w.seq, EventType: w.eventType,
			ContentType: w.contentType, Key: w.key, Payload: w.payload,
			// The stream's producer: this database's identity (I5).
			Producer:  p.prod.identity,
			Timestamp: stamp,
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
		envs[i] = env
	}
	// The topic's wire format (pkg/wire; nil: json) and the
	// contract-version header. A payload that does not fit the topic's
	// schema is refused like a record Kafka refuses: the row is tried
	// alone, then set aside with the reason, and other sources flow.
	encoded, encErrs := encodeRecords(p.cfg.Wire, rows, envs)
	var misfits map[int64]refused
	for i, w := range rows {
		rec, err := encoded[i], encErrs[i]
		if err != nil {
			var pe *wire.PayloadError
			if !errors.As(err, &pe) {
				_ = cl.EndTransaction(ctx, kgo.TryAbort)
				return fmt.Errorf("encode event %s for topic %q: %w", w.eventID, w.topic, err)
			}
			if misfits == nil {
				misfits = map[int64]refused{}
			}
			misfits[w.id] = refused{reason: ReasonSchema, err: err}
			continue
		}
		rowOf[rec] = w.id
		recs = append(recs, rec)
	}
	if misfits != nil {
		// Nothing was produced yet: end the (empty) transaction.
		if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
			return errors.Join(&refusedError{refused: misfits}, fmt.Errorf("abort transaction: %w", err))
		}
		return &refusedError{refused: misfits}
	}
	recs = append(recs, &kgo.Record{Topic: p.cfg.CheckpointTopic, Key: []byte(p.prod.ckptKey), Value: encodeCheckpointSet(p.prod.identity, ckpt), Timestamp: stamp})

	pctx, cancel := context.WithTimeout(ctx, p.cfg.TransactionTimeout)
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
	if produceErr == nil && !p.lease.Valid() {
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
	p.cfg.Hooks.beforeKafkaCommit()
	if err := cl.EndTransaction(pctx, kgo.TryCommit); err != nil {
		if errors.Is(err, kerr.OperationNotAttempted) {
			// Not committed: abort, and say so.
			aerr := cl.EndTransaction(pctx, kgo.TryAbort)
			return errors.Join(fmt.Errorf("commit not attempted: %w", err), aerr)
		}
		// Every record was acknowledged: where each one landed lets the
		// next recovery read how the transaction ended in its partition.
		p.inDoubt = newInDoubt(recs, rowOf)
		return fmt.Errorf("%w: commit: %w", errUnknownOutcome, err)
	}
	p.m.txnDuration.Observe(time.Since(begun).Seconds())
	p.m.batchSize.Observe(float64(len(rows)))
	p.m.published.Add(float64(len(rows)))
	return nil
}

// parallelEncodeMin is the smallest batch whose records a wire encoder
// builds on several cores: a registered format costs CPU per record (Avro
// about 9 µs, mostly reading the JSON payload), and while the publish loop
// encodes, the Kafka client and the database wait for it.
const parallelEncodeMin = 256

// encodeRecords builds the record of each row (rows[i] from envs[i]) with
// enc, in order: out[i] or errs[i]. The encoders of pkg/wire keep no state
// between records, so a large batch is split over GOMAXPROCS goroutines.
func encodeRecords(enc *wire.Encoder, rows []row, envs []envelope.Envelope) ([]*kgo.Record, []error) {
	out := make([]*kgo.Record, len(rows))
	errs := make([]error, len(rows))
	one := func(i int) { out[i], errs[i] = enc.Record(&envs[i], rows[i].topic) }
	workers := runtime.GOMAXPROCS(0)
	if enc == nil || len(rows) < parallelEncodeMin || workers < 2 {
		for i := range rows {
			one(i)
		}
		return out, errs
	}
	var wg sync.WaitGroup
	chunk := (len(rows) + workers - 1) / workers
	for from := 0; from < len(rows); from += chunk {
		to := min(from+chunk, len(rows))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := from; i < to; i++ {
				one(i)
			}
		}()
	}
	wg.Wait()
	return out, errs
}

// setAside records w, which Kafka refused on its own (or screening
// refused), in onceflow.outbox_set_aside: from the next poll on, no row of
// its source is published until it is resolved (R2), and every other source
// flows (I3). A failure to record it is counted and backed off.
func (p *publisher) setAside(ctx context.Context, w row, reason string, cause error) {
	if !p.lease.Valid() {
		if p.stop.Err() == nil {
			p.fail(ctx, errKindPostgres, "set row aside", ErrLeadershipLost)
		}
		return
	}
	retry := 0.0
	if retriedByRelay(reason) {
		retry = p.cfg.RetrySetAsideAfter.Seconds()
	}
	msg := truncate(cause.Error(), 2000)
	var inserted bool
	var attempts int
	err := p.cfg.DB.QueryRow(p.stop, qSetAside, w.id, reason, msg, retry, maxSetAsideRetry.Seconds()).Scan(&inserted, &attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return // published or deleted meanwhile
	}
	if err != nil {
		if p.stop.Err() == nil {
			p.fail(ctx, errKindPostgres, "set row aside", fmt.Errorf("set outbox row %d aside: %w", w.id, err))
		}
		return
	}
	if inserted {
		p.m.setAsideAll.WithLabelValues(reason).Inc()
		p.m.setAside.Inc() // until the next stats refresh
	}
	wait := "an operator (relay outbox failed retry|skip)"
	if retry > 0 {
		wait = "the relay's next try, or an operator"
	}
	p.log.ErrorContext(p.stop, "outbox row set aside: Kafka refuses it, it is over the relay's byte limit or it does not fit its topic's schema (see reason); its source waits, every other source flows",
		slog.Int64("outbox_id", w.id), slog.String("event_id", w.eventID), slog.String("topic", w.topic),
		slog.String("source", w.source), slog.Int64("seq", w.seq), slog.String("reason", reason),
		slog.Int("attempts", attempts), slog.String("waits_for", wait), slog.String("error", msg))
}

// markRows records a committed batch as published, retrying briefly. It
// runs on a goroutine of its own beside the next batch and reads only
// configuration.
func markRows(ctx context.Context, cfg Config, ids []int64) error {
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	bo := newBackoff(cfg.BackoffMax)
	return backoff.Retry(func() error {
		var marked, resolved int64
		err := cfg.DB.QueryRow(mctx, markQuery(cfg), ids).Scan(&marked, &resolved)
		if err != nil && mctx.Err() != nil {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(bo, mctx))
}

// markQuery is the statement that marks rows published (or deletes them).
func markQuery(cfg Config) string {
	if cfg.DeleteOnPublish {
		return qDeletePublished
	}
	return qMarkPublished
}

// waitMark waits for the running mark, if any.
func (p *publisher) waitMark() error {
	if p.inflight == nil {
		return nil
	}
	err := <-p.inflight.done
	p.inflight = nil
	if err != nil {
		return fmt.Errorf("mark batch published: %w", err)
	}
	return nil
}

// reset throws the producer away: the next round recovers.
func (p *publisher) reset() {
	_ = p.waitMark()
	if p.prod != nil {
		p.prod.cl.Close()
		p.prod = nil
	}
}

// fail counts and logs a failure, then backs off (until stop). The log
// line carries ctx's span: a failed transaction's carries its trace_id.
func (p *publisher) fail(ctx context.Context, kind, what string, err error) {
	p.m.errors.WithLabelValues(kind).Inc()
	p.log.ErrorContext(ctx, what, slog.String("kind", kind), slog.Any("error", err))
	_ = sleep(p.stop, p.bo.NextBackOff())
}
