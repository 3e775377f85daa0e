package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/seqguard"
	"github.com/onceflow/onceflow/pkg/wire"
)

// malformedKeyPrefix starts the inbox key of a record that has no valid
// envelope: "malformed:<topic>:<topic id>:<partition>:<offset>". The
// record's position in its topic's log is stable across redeliveries, so a
// malformed record is dead-lettered once; the topic ID tells a recreated
// topic's record at a reused offset from the old one. (Topic names have no
// ':'.) Keys written before topic IDs were part of them have no topic ID:
// see legacyMalformedKey.
const malformedKeyPrefix = "malformed:"

// malformedKey is the inbox key of a malformed record fetched from the
// topic with the given ID (as topicIDText writes it). Without an ID (the
// client did not report one) the key has the older form.
func malformedKey(r *kgo.Record, topicID string) string {
	if topicID == "" {
		return legacyMalformedKey(r)
	}
	return fmt.Sprintf("%s%s:%s:%d:%d", malformedKeyPrefix, r.Topic, topicID, r.Partition, r.Offset)
}

// legacyMalformedKey is the older key form, "malformed:<topic>:<partition>:
// <offset>". A row under it that kept the same headers and payload as a
// record at that position makes the record a duplicate (its redelivery);
// otherwise the record is new (the topic was recreated and the offset
// reused), and is dead-lettered under its new key.
func legacyMalformedKey(r *kgo.Record) string {
	return fmt.Sprintf("%s%s:%d:%d", malformedKeyPrefix, r.Topic, r.Partition, r.Offset)
}

// item is one record of a batch, decoded or not.
type item struct {
	rec *kgo.Record
	ev  Event
	// bad is why the record is malformed (nil when it decoded).
	bad error
	key string
	// topicID is the Kafka topic ID the record was fetched from (as
	// topicIDText writes it; "" when unknown): the partition's next offset
	// is stored under it.
	topicID string
	// span is the record's process span (nil with tracing off) and result
	// its outcome in the last transaction that decided on it (tracing.go).
	span   trace.Span
	result string
	// lane is the lane of the inbox row this transaction inserted for it
	// ("" when none): the sequence guard parks it there.
	lane string
}

// decodeItem decodes a record fetched from the topic with the given ID (""
// when unknown). dec turns a record in another wire format (avro, protobuf,
// json-schema, CloudEvents) into the JSON view first; the item keeps the
// view, which is what a parked event's inbox row and a DLQ copy hold. A
// record that cannot be viewed is malformed and keeps its raw form.
func decodeItem(ctx context.Context, dec *wire.Decoder, r *kgo.Record, maxPayload int, topicID string) item {
	view, err := dec.View(ctx, r)
	if err != nil {
		return item{rec: r, bad: err, key: malformedKey(r, topicID), topicID: topicID}
	}
	env, err := envelope.Decode(view, maxPayload)
	if err != nil {
		return item{rec: r, bad: err, key: malformedKey(r, topicID), topicID: topicID}
	}
	ev := eventFromEnvelope(env, r.Topic, r.Partition, r.Offset)
	ev.Raw = r
	return item{rec: view, ev: ev, key: env.EventID, topicID: topicID}
}

// outcome counts what a committed transaction did.
type outcome struct {
	processed, duplicates, dead, malformed int
	// deadItems are the items dead-lettered, for the optional DLQ copy.
	deadItems []deadLetter
	// guard tallies the sequence guard's decisions.
	guard guardSteps
	// deadReleased are released parked events the gap timer dead-lettered.
	deadReleased []deadReleased
	// notes are what the callbacks are told beyond the above (notify.go).
	notes notices
}

func (o *outcome) add(p outcome) {
	o.processed += p.processed
	o.duplicates += p.duplicates
	o.dead += p.dead
	o.malformed += p.malformed
	o.deadItems = append(o.deadItems, p.deadItems...)
	o.guard.add(p.guard)
	o.deadReleased = append(o.deadReleased, p.deadReleased...)
	o.notes.add(p.notes)
}

type deadLetter struct {
	rec    *kgo.Record
	reason string
	// info is what Config.OnDeadLetter is told.
	info DeadLettered
}

// applier runs the inbox transaction. It has no Kafka in it, so the
// transaction logic is testable against Postgres alone.
type applier struct {
	cfg     *Config
	handler BatchHandler
	// guard is the sequence-guard step (newGuard; tests may script it).
	// See guard.go.
	guard guard
	tr    *tracing
	// eff is the handler's Effecter side (nil: none), owner the owner of
	// its claims (prepare.go).
	eff   Effecter
	owner string
	// lanes caches the consumer's inbox lanes (lanes.go).
	lanes laneBook
}

// errStopped means the worker was told to stop while waiting to retry.
var errStopped = errors.New("inbox: worker stopped")

// applyTx applies items (all of one partition, in offset order) in one
// transaction: inbox insert, malformed dead letters, the sequence guard
// (which may park, hold or release events), the handler for what the guard
// releases,
// the next offset; then commit. A *HandlerError means the handler failed
// and the transaction was rolled back; any other error is infrastructure
// trouble.
func (a *applier) applyTx(ctx context.Context, items []item) (out outcome, err error) {
	return a.applyTxMode(ctx, items, false)
}

// applyTxMode is applyTx; with deadReleased, the handler runs per event
// under savepoints and a released parked event whose handler fails is
// dead-lettered in place while the rest applies (the last try of the
// isolated path when a failure may be a released event's).
func (a *applier) applyTxMode(ctx context.Context, items []item, deadReleased bool) (out outcome, err error) {
	if len(items) == 0 {
		return out, nil
	}
	ctx, txSpan := a.tr.startTx(ctx, "inbox transaction", items)
	var released []releasedSpan
	defer func() {
		endReleased(released, txSpan, &out, err)
		endTx(txSpan, items, &out, err)
	}()
	// The lanes of the batch's types (recorded once, before the
	// transaction: making a bucket's partition is DDL of its own).
	lanes, err := a.itemLanes(ctx, items)
	if err != nil {
		return out, err
	}
	tx, err := a.cfg.Pool.Begin(ctx)
	if err != nil {
		return out, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	// 1. Inbox rows of the valid events and the partition's next offset:
	// one statement for the batch.
	last := items[len(items)-1].rec
	isNew, err := a.insertValid(ctx, tx, items, lanes, last.Offset+1)
	if err != nil {
		return out, err
	}
	// 2. Malformed records become dead letters with the reason.
	for i := range items {
		it := &items[i]
		if it.bad == nil {
			continue
		}
		inserted, err := a.insertDead(ctx, tx, it, lanes.probe, 0, it.bad.Error())
		if err != nil {
			return out, err
		}
		if inserted {
			out.dead++
			out.malformed++
			out.deadItems = append(out.deadItems, deadLetter{rec: it.rec, reason: it.bad.Error(), info: deadInfo(it, it.bad.Error())})
			it.result = outcomeDeadLettered
		} else {
			out.duplicates++
			it.result = outcomeDuplicate
		}
	}
	// 3. The sequence guard: it locks the state of the new events' sources
	// once (in a fixed order, so that batches of different partitions
	// cannot deadlock), then admits each new event in offset order and
	// answers with the events to apply now, in order.
	var fresh []*item
	for i := range items {
		it := &items[i]
		if it.bad != nil {
			continue
		}
		if !isNew[i] {
			out.duplicates++
			it.result = outcomeDuplicate
			continue
		}
		fresh = append(fresh, it)
	}
	var apply []Event
	kept := map[string]seqguard.Event{}
	if len(fresh) > 0 {
		adm, err := a.guard.lock(ctx, tx, fresh, lanes.probe)
		if err != nil {
			return out, fmt.Errorf("sequence guard: %w", err)
		}
		for _, it := range fresh {
			v, err := adm.admit(ctx, it)
			if err != nil {
				return out, fmt.Errorf("sequence guard: %w", err)
			}
			a.tr.noteAdmitted(it, v)
			released = append(released, a.tr.startReleased(ctx, v.apply, releaseReason(v.raw))...)
			apply = append(apply, v.apply...)
			out.guard.add(v.steps)
			out.notes.late = append(out.notes.late, lateNotices(&it.ev, v.apply, v.raw)...)
			// A redelivery of an event the guard applied in order (its
			// inbox row was pruned) is a duplicate, under either late policy.
			out.duplicates += v.steps.counts.Duplicates
			for _, e := range v.released {
				kept[e.EventID] = e
			}
		}
		if err := adm.flush(ctx); err != nil {
			return out, fmt.Errorf("sequence guard: %w", err)
		}
		if err := a.recordGapTraces(ctx, tx, out.guard.givenUp); err != nil {
			return out, err
		}
	}
	// 4. The handler, in the same transaction.
	switch {
	case len(apply) == 0:
	case deadReleased && len(kept) > 0:
		if err := a.runEach(ctx, tx, apply, kept, func(Event) bool { return true }, &out); err != nil {
			return out, err
		}
	default:
		if err := a.runHandler(ctx, tx, apply); err != nil {
			var he *HandlerError
			if errors.As(err, &he) && len(kept) > 0 {
				he.withReleased = true
			}
			return out, err
		}
		out.processed = len(apply)
	}
	a.cfg.Hooks.afterHandler()
	if err := tx.Commit(ctx); err != nil {
		return out, fmt.Errorf("commit: %w", err)
	}
	return out, nil
}

// allKnown reports whether the inbox already has every item's key: then the
// whole batch is redelivery and needs no transaction (one read-only index
// probe per key, no write). Rows still being inserted by another
// transaction are not visible here, so such a batch takes the normal path
// and waits for that transaction, as it must. The partition's next offset is
// not stored for such a batch: after a crash it is merely read again.
func (a *applier) allKnown(ctx context.Context, items []item) (bool, error) {
	keys := make([]string, len(items))
	seen := make(map[string]bool, len(items))
	for i := range items {
		keys[i] = items[i].key
		seen[items[i].key] = true
	}
	probe, err := a.lanes.probeLanes(ctx, a.cfg.Pool, a.cfg.ConsumerName)
	if err != nil {
		return false, err
	}
	since, err := a.lanes.idTimeSince(ctx, a.cfg.Pool)
	if err != nil {
		return false, err
	}
	q, err := withLanes(qKnown, probe, since)
	if err != nil {
		return false, err
	}
	var n int
	if err := a.cfg.Pool.QueryRow(ctx, q, probeMode, a.cfg.ConsumerName, keys, batchFloor(keys)).Scan(&n); err != nil {
		return false, fmt.Errorf("probe inbox: %w", err)
	}
	return n == len(seen), nil
}

// probeMode runs the statements that probe the consumer's inbox partitions
// for a batch's keys (qInsertBatch, qKnown) as unnamed statements, which
// PostgreSQL plans for their arguments at every execution. A prepared
// statement switches to a generic plan after five executions, and one made
// while the partitions were nearly empty reads each of them whole (a
// sequential scan, hashed) at every batch from then on, however large they
// grow: a drain of 100k events into a fresh consumer's inbox fell from
// 36k to 3–4k events/s in some runs (session 13, auto_explain). Planning a
// batch's statement costs well under a millisecond.
const probeMode = pgx.QueryExecModeCacheDescribe

// batchLanes are the lanes of a batch's valid items (by item index; ""
// for a malformed one) and the lanes the dedup probe covers.
type batchLanes struct {
	byItem []string
	probe  []string
}

// itemLanes resolves the lanes of items' event types.
func (a *applier) itemLanes(ctx context.Context, items []item) (batchLanes, error) {
	var types []string
	idx := make([]int, len(items))
	seen := map[string]int{}
	for i := range items {
		if items[i].bad != nil {
			idx[i] = -1
			continue
		}
		t := items[i].ev.EventType
		j, ok := seen[t]
		if !ok {
			j = len(types)
			seen[t] = j
			types = append(types, t)
		}
		idx[i] = j
	}
	warn := func(err error) {
		a.cfg.Logger.WarnContext(ctx, "inbox partitions", "error", err.Error())
	}
	lanes, probe, err := a.lanes.resolve(ctx, a.cfg.Pool, a.cfg.ConsumerName, types, warn)
	if err != nil {
		return batchLanes{}, err
	}
	if err := a.lanes.refreshSealed(ctx, a.cfg.Pool, a.cfg.ConsumerName, int64(a.cfg.SealedFilterMaxBytes), warn); err != nil {
		return batchLanes{}, err
	}
	out := batchLanes{byItem: make([]string, len(items)), probe: probe}
	for i, j := range idx {
		if j >= 0 {
			out.byItem[i] = lanes[j]
		}
	}
	return out, nil
}

// insertValid inserts the valid items' rows, stores nextOffset, and reports,
// per item index, whether it was new. Of two copies of one key in the batch,
// only the first is new (the later ones are not even offered: copies of
// different types would go to different lanes).
func (a *applier) insertValid(ctx context.Context, tx pgx.Tx, items []item, lanes batchLanes, nextOffset int64) ([]bool, error) {
	n := 0
	for i := range items {
		if items[i].bad == nil {
			n++
		}
	}
	isNew := make([]bool, len(items))
	ids := make([]string, 0, n)
	sources := make([]string, 0, n)
	seqs := make([]int64, 0, n)
	types := make([]string, 0, n)
	offsets := make([]int64, 0, n)
	producers := make([]string, 0, n)
	rowLanes := make([]string, 0, n)
	floors := make([]pgtype.Timestamptz, 0, n)
	since, err := a.lanes.idTimeSince(ctx, tx)
	if err != nil {
		return nil, err
	}
	offered := make(map[string]bool, n)
	for i := range items {
		if items[i].bad != nil || offered[items[i].key] {
			continue
		}
		offered[items[i].key] = true
		ev := &items[i].ev
		ids = append(ids, ev.EventID)
		sources = append(sources, ev.Source)
		seqs = append(seqs, ev.Seq)
		types = append(types, ev.EventType)
		offsets = append(offsets, ev.Offset)
		producers = append(producers, ev.Producer)
		rowLanes = append(rowLanes, lanes.byItem[i])
		floors = append(floors, idFloor(ev.EventID))
	}
	if _, err := tx.Exec(ctx, qLockKeys, a.cfg.ConsumerName, ids); err != nil {
		return nil, fmt.Errorf("lock inbox keys: %w", err)
	}
	first := items[0].rec
	// The keys that may be in a sealed bucket are probed as before; the
	// others (ids without a time that no sealed bucket's filter holds)
	// outside the sealed buckets (sealed.go).
	sealed := a.lanes.sealedSet()
	dirty, clean := sealed.split(ids, lanes.probe)
	q, err := insertStatement(lanes.probe, since, sealed, len(dirty) > 0, len(clean) > 0)
	if err != nil {
		return nil, err
	}
	// Planned for its arguments at every batch (probeMode): the probe of
	// the consumer's partitions must not run a plan made when they were
	// empty.
	rows, err := tx.Query(ctx, q, probeMode, a.cfg.ConsumerName, first.Topic, first.Partition, ids, sources, seqs, types, offsets,
		a.cfg.Group, nextOffset, nullIfEmpty(items[0].topicID), producers, rowLanes, floors, batchFloor(dirty), dirty, clean)
	if err != nil {
		return nil, fmt.Errorf("insert inbox rows: %w", err)
	}
	inserted := make(map[string]string, n) // key -> the row's lane
	for rows.Next() {
		var id, lane string
		if err := rows.Scan(&id, &lane); err != nil {
			rows.Close()
			return nil, fmt.Errorf("insert inbox rows: %w", err)
		}
		inserted[id] = lane
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("insert inbox rows: %w", err)
	}
	for i := range items {
		items[i].lane = ""
		if lane, ok := inserted[items[i].key]; ok && items[i].bad == nil {
			isNew[i] = true
			items[i].lane = lane
			delete(inserted, items[i].key) // a later copy is a duplicate
		}
	}
	return isNew, nil
}

func (a *applier) insertDead(ctx context.Context, tx pgx.Tx, it *item, probe []string, attempts int, reason string) (bool, error) {
	r := it.rec
	source, eventType := it.ev.Source, it.ev.EventType
	var seq *int64
	if it.bad == nil {
		seq = &it.ev.Seq
	} else {
		// Best effort identification from the raw headers, for operators.
		for _, h := range r.Headers {
			switch strings.ToLower(h.Key) {
			case envelope.HeaderSource:
				source = cleanText(h.Value, envelope.MaxSourceBytes)
			case envelope.HeaderEventType:
				eventType = cleanText(h.Value, envelope.MaxEventTypeBytes)
			case envelope.HeaderSeq:
				if v, err := strconv.ParseInt(string(h.Value), 10, 64); err == nil {
					seq = &v
				}
			}
		}
	}
	// A malformed record under a new-form key may have been dead-lettered
	// under the older form (before the upgrade): see legacyMalformedKey.
	var oldKey *string
	if it.bad != nil && it.key != legacyMalformedKey(r) {
		k := legacyMalformedKey(r)
		oldKey = &k
	}
	if _, err := tx.Exec(ctx, qLockKeys, a.cfg.ConsumerName, []string{it.key}); err != nil {
		return false, fmt.Errorf("lock inbox key: %w", err)
	}
	q, err := withLanes(qInsertDead, probe, pgtype.Timestamptz{}) // no look-up in it: since is not used
	if err != nil {
		return false, err
	}
	var id string
	err = tx.QueryRow(ctx, q, a.cfg.ConsumerName, it.key, source, seq, eventType,
		r.Topic, r.Partition, r.Offset, attempts, safeText(reason), recordHeaders(r), r.Value, oldKey, it.ev.Producer).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("insert dead letter: %w", err)
	}
	return true, nil
}

// runHandler calls the handler, turning a panic or any handler failure into
// a *HandlerError, unless the connection itself is gone (infrastructure).
func (a *applier) runHandler(ctx context.Context, tx pgx.Tx, evs []Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
		if err == nil {
			return
		}
		id := evs[0].EventID
		if len(evs) > 1 {
			id = fmt.Sprintf("%s (batch of %d)", id, len(evs))
		}
		// A handler that outlives BatchTimeout is the event's problem: it is
		// isolated and, if it keeps happening, dead-lettered.
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = &HandlerError{EventID: id, Err: fmt.Errorf("batch timeout: %w", err)}
			return
		}
		if tx.Conn().IsClosed() || isRetryableDB(err) {
			// Infrastructure: retried, never dead-lettered, so no
			// *HandlerError (perEvent's included) may remain in the chain.
			var he *HandlerError
			if errors.As(err, &he) {
				err = he.Err
			}
			err = fmt.Errorf("handler: %w", err)
			return
		}
		var he *HandlerError
		if !errors.As(err, &he) {
			err = &HandlerError{EventID: id, Err: err}
		}
	}()
	return a.handler.HandleBatch(withOwner(withConsumerName(ctx, a.cfg.ConsumerName), a.owner), tx, evs)
}

// applyIsolated applies items one transaction each, retrying a failing event
// with exponential backoff and dead-lettering it when the retries are
// exhausted. stop aborts a backoff wait (the event is left for the next
// owner of the partition). A non-handler error is returned as is.
func (a *applier) applyIsolated(ctx context.Context, items []item, stop <-chan struct{}, onHandlerErr func(error)) (outcome, error) {
	var total outcome
	for i := range items {
		it := items[i : i+1]
		b := backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(a.cfg.RetryInitialInterval),
			backoff.WithMaxInterval(a.cfg.RetryMaxInterval),
			backoff.WithMaxElapsedTime(a.cfg.RetryMaxElapsed),
		)
		for attempt := 1; ; attempt++ {
			if n, err := a.prepare(ctx, it, stop); err != nil {
				return total, err
			} else if n == 0 {
				return total, errStopped
			}
			out, err := a.withTimeout(ctx, func(ctx context.Context) (outcome, error) { return a.applyTx(ctx, it) })
			if err == nil {
				total.add(out)
				break
			}
			var he *HandlerError
			if !errors.As(err, &he) {
				return total, err
			}
			onHandlerErr(err)
			handlerFailed(&items[i], attempt, he.Err)
			if p := items[i].ev.prep; p != nil && p.Err != nil {
				items[i].ev.prep = nil // the next try makes the effect again
			}
			wait := b.NextBackOff()
			last := attempt >= a.cfg.RetryMaxAttempts || wait == backoff.Stop || isPermanent(he.Err)
			if last && he.withReleased {
				// The failure may be a released parked event's: one last try
				// dead-letters a failing released event in place and applies
				// the rest; if the event itself fails, it is dead-lettered below.
				out, err := a.withTimeout(ctx, func(ctx context.Context) (outcome, error) { return a.applyTxMode(ctx, it, true) })
				if err == nil {
					for _, d := range out.deadReleased {
						a.cfg.Logger.ErrorContext(EventContext(ctx, d.Event), "event dead-lettered", "event_id", d.EventID, "source", d.Source, "seq", d.Seq,
							"attempts", attempt, "error", d.reason, "released_by", items[i].key)
					}
					total.add(out)
					break
				}
				if !errors.As(err, &he) {
					return total, err
				}
				onHandlerErr(err)
			}
			if last {
				out, err := a.withTimeout(ctx, func(ctx context.Context) (outcome, error) {
					return a.deadLetterTx(ctx, &items[i], attempt, he.Err.Error())
				})
				if err != nil {
					return total, err
				}
				a.cfg.Logger.ErrorContext(itemContext(ctx, &items[i]), "event dead-lettered",
					"event_id", items[i].key, "topic", items[i].rec.Topic, "partition", items[i].rec.Partition,
					"offset", items[i].rec.Offset, "attempts", attempt, "error", he.Err.Error())
				total.add(out)
				break
			}
			a.cfg.Logger.WarnContext(itemContext(ctx, &items[i]), "handler failed, will retry",
				"event_id", items[i].key, "attempt", attempt, "retry_in", wait.String(), "error", he.Err.Error())
			if err := sleep(wait, stop); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

// deadLetterTx records a failing event as dead, with its partition's next
// offset, in one transaction.
func (a *applier) deadLetterTx(ctx context.Context, it *item, attempts int, reason string) (out outcome, err error) {
	ctx, txSpan := a.tr.startTx(ctx, "inbox transaction", []item{*it})
	defer func() { endTx(txSpan, nil, &out, err) }()
	probe, err := a.lanes.probeLanes(ctx, a.cfg.Pool, a.cfg.ConsumerName)
	if err != nil {
		return out, err
	}
	tx, err := a.cfg.Pool.Begin(ctx)
	if err != nil {
		return out, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	inserted, err := a.insertDead(ctx, tx, it, probe, attempts, reason)
	if err != nil {
		return out, err
	}
	if _, err := tx.Exec(ctx, qStoreOffset, a.cfg.Group, it.rec.Topic, it.rec.Partition, it.rec.Offset+1, nullIfEmpty(it.topicID)); err != nil {
		return out, fmt.Errorf("store next offset: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return out, fmt.Errorf("commit: %w", err)
	}
	if inserted {
		out.dead = 1
		out.deadItems = []deadLetter{{rec: it.rec, reason: reason, info: deadInfo(it, reason)}}
		it.result = outcomeDeadLettered
	} else {
		out.duplicates = 1 // someone else applied or dead-lettered it meanwhile
		it.result = outcomeDuplicate
	}
	if it.span != nil && it.span.IsRecording() {
		it.span.AddLink(trace.Link{SpanContext: txSpan.SpanContext()})
	}
	return out, nil
}

func (a *applier) withTimeout(ctx context.Context, f func(context.Context) (outcome, error)) (outcome, error) {
	if a.cfg.BatchTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.cfg.BatchTimeout)
		defer cancel()
	}
	return f(ctx)
}

func sleep(d time.Duration, stop <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-stop:
		return errStopped
	}
}

// recordHeaders is the JSON object of a record's headers, kept with dead,
// parked and held rows so that the event can be decoded again for replay.
// Invalid UTF-8 is replaced (such a record is malformed anyway).
func recordHeaders(r *kgo.Record) []byte {
	m := make(map[string]string, len(r.Headers))
	for _, h := range r.Headers {
		m[safeText(h.Key)] = safeText(string(h.Value))
	}
	b, _ := json.Marshal(m)
	return b
}

// recordFromRow rebuilds the record a kept inbox row came from, so that it
// can be decoded with envelope.Decode again. The key is not kept: the
// rebuilt record's key is the source.
func recordFromRow(topic string, partition int32, offset int64, headers []byte, payload []byte) (*kgo.Record, error) {
	var m map[string]string
	if len(headers) > 0 {
		if err := json.Unmarshal(headers, &m); err != nil {
			return nil, fmt.Errorf("decode kept headers: %w", err)
		}
	}
	r := &kgo.Record{Topic: topic, Partition: partition, Offset: offset, Value: payload}
	for k, v := range m {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	return r, nil
}

// nullIfEmpty is s, or SQL NULL when s is empty.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// safeText makes s storable in a Postgres text or jsonb value: valid UTF-8
// and no NUL.
func safeText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func cleanText(b []byte, limit int) string {
	s := safeText(string(b))
	if len(s) > limit {
		s = s[:limit]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
