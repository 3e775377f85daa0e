package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/relay/internal/identity"
	"github.com/onceflow/onceflow/pkg/relay/internal/lease"
)

// recoverer makes the producer a term publishes with, and settles what
// earlier relays left: it binds the database identity, fences the previous
// producer of the transactional.id and marks the rows the last checkpoint
// names, once the checkpoint is proven to be this database's. It is the only
// writer of its fields, which outlive a term.
type recoverer struct {
	cfg Config
	log *slog.Logger
	lay layout

	// identity is the database identity the relay bound first; it may not
	// change while the relay runs.
	identity string
	// legacySettled: the legacy checkpoints are settled (legacy_v1.go).
	legacySettled bool
	// m counts split transactions (nil in tests that build a recoverer).
	m *metrics
}

// producer is a recovered transactional producer and what it publishes
// under; the publisher that receives it owns it.
type producer struct {
	cl       *kgo.Client
	identity string // the records' producer (I5) and the checkpoint's db
	txnID    string
	ckptKey  string
	// recovered is what the recovery did, for the span of the first
	// transaction.
	recovered *recovery
}

// recover binds the relay to this database's identity, builds a new
// transactional producer and finishes the last batch: initialising the
// transactional.id fences any older producer with it and completes or
// aborts its pending transaction; then the rows the last committed
// checkpoint names are marked published, once the checkpoint is proven to be
// this database's, row by row. Only the last two batches can be on Kafka but
// unmarked (batch N's mark finishes before batch N+2 begins), and the last
// checkpoint names both.
func (r *recoverer) recover(ctx context.Context, log *slog.Logger, inDoubt *inDoubtBatch) (*producer, error) {
	id, err := r.bind(ctx)
	if err != nil {
		return nil, err
	}
	p := &producer{identity: id, txnID: r.txnIDOf(id, r.cfg.Shard), ckptKey: checkpointKey(id, r.cfg.Shard)}

	ictx, cancel := context.WithTimeout(ctx, r.cfg.TransactionTimeout+5*time.Second)
	defer cancel()
	if err := r.settleLegacy(ictx, log); err != nil {
		return nil, err
	}
	cl, err := r.initProducer(ictx, p.txnID)
	if err != nil {
		return nil, err
	}
	rec, err := lastCheckpoint(ictx, r.cfg.Hooks.checkpointReaderOpts(r.cfg.KafkaOpts), r.cfg.CheckpointTopic, p.ckptKey)
	if err != nil {
		cl.Close()
		return nil, err
	}
	attrs := []any{slog.String("transactional_id", p.txnID), slog.String("checkpoint_key", p.ckptKey)}
	// A batch in doubt is settled by its own records: its aborted rows are
	// not marked even if a checkpoint names them, its committed ones are
	// marked even if none does.
	var skip map[int64]bool
	var settled *settlement
	if inDoubt != nil {
		s, err := settleInDoubt(ictx, r.cfg.Hooks.checkpointReaderOpts(r.cfg.KafkaOpts), inDoubt)
		switch {
		case err != nil && time.Since(inDoubt.at) < inDoubtPatience:
			cl.Close()
			return nil, fmt.Errorf("settle the batch whose commit outcome was unknown: %w", err)
		case err != nil:
			log.ErrorContext(ctx, "the batch whose commit outcome was unknown could not be settled by its records: settled by the checkpoint alone",
				append(attrs, slog.Duration("tried_for", time.Since(inDoubt.at).Round(time.Second)), slog.Any("error", err))...)
		default:
			settled, skip = &s, map[int64]bool{}
			for _, id := range s.aborted {
				skip[id] = true
			}
			log.InfoContext(ctx, "batch in doubt settled by its records", append(attrs, slog.String("outcome", s.String()))...)
			if s.split() {
				if r.m != nil {
					r.m.errors.WithLabelValues(errKindSplit).Inc()
				}
				log.ErrorContext(ctx, "Kafka ended one transaction differently in different partitions: each row goes by its own record (committed: marked published; aborted: published again)",
					append(attrs, slog.String("kind", errKindSplit), slog.String("outcome", s.String()))...)
			}
		}
	}
	markSettled := func() (int64, error) {
		if settled == nil || len(settled.committed) == 0 {
			return 0, nil
		}
		var marked, resolved int64
		if err := r.cfg.DB.QueryRow(ictx, markQuery(r.cfg), settled.committed).Scan(&marked, &resolved); err != nil {
			return 0, fmt.Errorf("mark the committed rows of the batch whose commit outcome was unknown: %w", err)
		}
		return marked, nil
	}
	if rec == nil {
		marked, err := markSettled()
		if err != nil {
			cl.Close()
			return nil, err
		}
		p.cl, p.recovered = cl, &recovery{marked: marked}
		log.InfoContext(ctx, "producer ready, recovered from checkpoint", append(attrs, slog.String("checkpoint", "none"), slog.Int64("marked", marked))...)
		return p, nil
	}
	c, err := decodeCheckpoint(rec.Value)
	if err != nil {
		cl.Close()
		return nil, &IdentityError{
			Problem: fmt.Sprintf("checkpoint record %s[%d]@%d under key %q cannot be read: %v", rec.Topic, rec.Partition, rec.Offset, p.ckptKey, err),
			Fix:     "inspect the record; if this relay did not write it, run `relay identity reset -note …` (docs/relay.md, \"Restored or copied databases\")",
		}
	}
	marked, err := r.applyCheckpoint(ictx, c, rec, "checkpoint", r.lay.own(), skip)
	if err != nil {
		cl.Close()
		return nil, err
	}
	more, err := markSettled()
	if err != nil {
		cl.Close()
		return nil, err
	}
	marked += more
	p.cl, p.recovered = cl, &recovery{checkpointIDs: len(c.ids), marked: marked}
	log.InfoContext(ctx, "producer ready, recovered from checkpoint", append(attrs,
		slog.Int64("checkpoint_offset", rec.Offset), slog.Int("checkpoint_ids", len(c.ids)), slog.Int64("marked", marked))...)
	return p, nil
}

// bind binds the relay to this database's identity (identity.Bind) and
// returns it; the identity may not change while the relay runs.
func (r *recoverer) bind(ctx context.Context) (string, error) {
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
func (r *recoverer) txnIDOf(identity, shard string) string {
	if r.cfg.TransactionalIDPrefix == "" {
		return DefaultTransactionalID(identity, shard)
	}
	return r.cfg.TransactionalIDPrefix + shard
}

// producerMetadataMinAge is the least time between two metadata loads of
// the relay's producer, unless KafkaOpts set kgo.MetadataMinAge. A produce
// that gets a retriable partition error (with Kafka 4's transactions
// likely a CONCURRENT_TRANSACTIONS: the previous commit's markers still
// being written) waits for a metadata load before it is sent again, and
// franz-go's default keeps 5 s between loads: a producer that had just
// loaded metadata (its first record to a topic: the first batch after
// start-up) held its next transaction open for up to 5 s, under load once
// in many benchmark drains (docs/performance.md, "Wire formats, round 2").
// Kafka's Java producer waits retry.backoff.ms, 100 ms by default.
const producerMetadataMinAge = 250 * time.Millisecond

// initProducer creates a transactional producer and initialises its id.
func (r *recoverer) initProducer(ctx context.Context, txnID string) (*kgo.Client, error) {
	opts := append([]kgo.Opt{kgo.MetadataMinAge(producerMetadataMinAge)}, r.cfg.KafkaOpts...)
	opts = append(opts,
		kgo.TransactionalID(txnID),
		kgo.TransactionTimeout(r.cfg.TransactionTimeout),
		kgo.RecordDeliveryTimeout(r.cfg.TransactionTimeout/2+r.cfg.clockBehind()),
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

// settleLayout finishes what relays with another shard count left, once
// all their leases have expired and before any relay with this count
// takes a lease: for each of their shards it fences the shard's
// transactional.id (which completes or aborts its open transaction), marks
// the rows its last checkpoint names (all of them: they are on Kafka,
// whichever shard owns their source now) and deletes the lease. Without
// it, a row published but not yet marked under the old count would be
// published again by the shard that owns its source under the new one. It
// holds the lease lock throughout, so no relay takes a lease meanwhile.
func (r *recoverer) settleLayout(ctx context.Context, l *lease.Lease) error {
	id, err := r.bind(ctx)
	if err != nil {
		return err
	}
	s, err := l.Settle(ctx)
	if err != nil {
		return err
	}
	defer s.Rollback(ctx)
	if s.Others.Live() {
		return s.Commit(ctx) // a live one: acquire waits for it
	}
	for _, o := range s.Others {
		marked, err := r.settleShard(ctx, id, o)
		if err != nil {
			return fmt.Errorf("settle shard %q of %d: %w", o.Shard, o.Shards, err)
		}
		if err := s.Drop(ctx, o); err != nil {
			return fmt.Errorf("delete lease of shard %q of %d: %w", o.Shard, o.Shards, err)
		}
		r.log.InfoContext(ctx, "settled a shard of another shard count: its transactional.id fenced, its checkpoint's rows marked, its lease deleted",
			slog.String("old_shard", o.Shard), slog.Int("old_shards", o.Shards), slog.Int64("marked", marked))
	}
	return s.Commit(ctx)
}

// settleShard fences the transactional.id of another shard count's shard
// o and marks the rows its last checkpoint names, returning how many.
func (r *recoverer) settleShard(ctx context.Context, identity string, o lease.Other) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.TransactionTimeout+5*time.Second)
	defer cancel()
	cl, err := r.initProducer(ctx, r.txnIDOf(identity, o.Shard))
	if err != nil {
		return 0, err
	}
	cl.Close()
	key := checkpointKey(identity, o.Shard)
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
	return r.applyCheckpoint(ctx, c, rec, "checkpoint", nil, nil)
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
func (r *recoverer) applyCheckpoint(ctx context.Context, c checkpoint, rec *kgo.Record, what string, own func(source string) bool, skip map[int64]bool) (int64, error) {
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
		case unpublished && skip[id]:
			// In doubt, and aborted in its own partition.
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
	if err := r.cfg.DB.QueryRow(ctx, markQuery(r.cfg), mark).Scan(&marked, &resolved); err != nil {
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
func (r *recoverer) checkStreams(ctx context.Context, c checkpoint, where string) error {
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
