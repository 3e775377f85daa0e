// Package reconcile checks, after the fact, that what a producing database
// committed reached a topic once and in order and was applied once by a
// consumer: the engine of `consumer reconcile` (docs/reliability.md,
// "Reconcile").
//
// A run reads, for a time window or an outbox id range, the producing
// database's outbox and publish log, the topics with read_committed, and a
// consumer's inbox, stored offsets and given-up gaps, and reports per
// stream (producer, topic, source) what does not add up. It only reads
// (READ ONLY transactions); Record stores a run's summary for the console.
//
// Memory: per stream, sets of seqs kept as ranges (Set), so a gap-free
// stream of a million events costs one range. Config.MaxRanges bounds the
// total.
package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/envelope"
)

// The kinds of finding.
const (
	// CommittedNotPublished: an outbox row of the window that the relay no
	// longer queues, but whose record is not on the topic.
	CommittedNotPublished = "committed_not_published"
	// PublishedNeverCommitted: a record of this producer on the topic
	// whose (topic, source, seq) is in no outbox row.
	PublishedNeverCommitted = "published_never_committed"
	// PublishedTwice: a stream's seq on the topic more than once.
	PublishedTwice = "published_twice"
	// OutOfOrder: a record whose seq is lower than one before it in its
	// partition.
	OutOfOrder = "out_of_order"
	// PublishedNotApplied: a record below the consumer's stored offset
	// that the inbox does not show applied (nor parked).
	PublishedNotApplied = "published_not_applied"
	// AppliedTwice: two applied inbox rows for one stream's seq.
	AppliedTwice = "applied_twice"
	// GapGivenUp: a gap the consumer gave up, with what it skipped.
	GapGivenUp = "gap_given_up"
)

// Defaults of Config.
const (
	DefaultClockMargin = 5 * time.Minute
	DefaultMaxRanges   = 4_000_000
	DefaultSettle      = time.Minute
	// streamCost is what one stream counts toward MaxRanges (its sets and
	// map, in 16-byte ranges).
	streamCost = 32
	// maxListedRanges bounds the ranges one finding lists.
	maxListedRanges = 100
)

// Config configures a run. Fields are alphabetical.
type Config struct {
	// ClockMargin is how far the clocks of the database, the relay and the
	// consumer may disagree: the topic is read from the window's start less
	// it, the inbox from twice it (default DefaultClockMargin).
	ClockMargin time.Duration
	// Consumer is the inbox's logical consumer name (required unless
	// ProducerOnly).
	Consumer string
	// ConsumerOnly skips the producer's side: committed_not_published and
	// published_never_committed are not judged (for a relay that runs with
	// -delete-on-publish, whose outbox keeps nothing of what it published).
	ConsumerOnly bool
	// ConsumerPool reaches the consumer's database: onceflow.inbox,
	// consumer_offsets, seq_gaps (required unless ProducerOnly).
	ConsumerPool *pgxpool.Pool
	// From and To bound the window by the outbox rows' created_at (To
	// zero: now). Either From or FromID is required.
	From, To time.Time
	// FromID and ToID bound the window by outbox id instead (both
	// included; ToID zero: no upper bound).
	FromID, ToID int64
	// Group is the consumer group whose stored offsets say how far the
	// consumer got (required unless ProducerOnly).
	Group string
	// KafkaOpts are the client options: seed brokers, TLS, SASL (required).
	KafkaOpts []kgo.Opt
	// Logger receives progress lines (default: discarded).
	Logger *slog.Logger
	// MaxRanges bounds the seq ranges a run holds (about 16 bytes each; a
	// stream counts 32): beyond it the run stops rather than grow (default
	// DefaultMaxRanges, about 64 MiB).
	MaxRanges int
	// ProducerOnly judges the relay's side only, no consumer read: the
	// outbox against the topics (committed_not_published,
	// published_never_committed) and this producer's records on them
	// (published_twice, out_of_order); `relay reconcile`.
	ProducerOnly bool
	// OutboxPool reaches the producing database: onceflow.outbox,
	// outbox_pending, outbox_published, outbox_set_aside,
	// database_identity (required).
	OutboxPool *pgxpool.Pool
	// Settle leaves out the outbox rows committed in its last stretch
	// before the run: the relay may not have published them yet (default
	// DefaultSettle; negative: none).
	Settle time.Duration
	// Topics are the topics to read (required).
	Topics []string
}

// ErrTooLarge means the window needs more memory than Config.MaxRanges
// allows.
var ErrTooLarge = errors.New("reconcile: the window holds more seq ranges than -max-ranges allows: use a smaller window")

func (c *Config) withDefaults() {
	if c.ClockMargin == 0 {
		c.ClockMargin = DefaultClockMargin
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxRanges == 0 {
		c.MaxRanges = DefaultMaxRanges
	}
	switch {
	case c.Settle == 0:
		c.Settle = DefaultSettle
	case c.Settle < 0:
		c.Settle = 0
	}
}

// ConfigError names a bad Config field.
type ConfigError struct{ Field, Reason string }

func (e *ConfigError) Error() string { return "reconcile: " + e.Field + " " + e.Reason }

func (c *Config) validate() error {
	switch {
	case c.ProducerOnly && c.ConsumerOnly:
		return &ConfigError{"ProducerOnly", "and ConsumerOnly are exclusive"}
	case c.ConsumerPool == nil && !c.ProducerOnly:
		return &ConfigError{"ConsumerPool", "is required"}
	case c.OutboxPool == nil:
		return &ConfigError{"OutboxPool", "is required"}
	case c.Consumer == "" && !c.ProducerOnly:
		return &ConfigError{"Consumer", "is required"}
	case c.Group == "" && !c.ProducerOnly:
		return &ConfigError{"Group", "is required"}
	case len(c.Topics) == 0:
		return &ConfigError{"Topics", "is required"}
	case len(c.KafkaOpts) == 0:
		return &ConfigError{"KafkaOpts", "is required (the seed brokers)"}
	case c.From.IsZero() && c.FromID == 0:
		return &ConfigError{"From", "or FromID is required"}
	case !c.From.IsZero() && c.FromID != 0:
		return &ConfigError{"FromID", "and From are exclusive"}
	case c.FromID < 0 || c.ToID < 0 || (c.ToID != 0 && c.ToID < c.FromID):
		return &ConfigError{"ToID", fmt.Sprintf("must be at least FromID (%d), got %d", c.FromID, c.ToID)}
	case !c.To.IsZero() && !c.To.After(c.From):
		return &ConfigError{"To", "must be after From"}
	case c.ClockMargin < 0:
		return &ConfigError{"ClockMargin", "must not be negative"}
	case c.MaxRanges < 0:
		return &ConfigError{"MaxRanges", "must not be negative"}
	}
	return nil
}

// Report is the outcome of a run.
type Report struct {
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	// Producer is the producing database's identity: the producer header of
	// its relay's records.
	Producer string   `json:"producer"`
	Consumer string   `json:"consumer"`
	Group    string   `json:"group"`
	Topics   []string `json:"topics"`
	// ProducerOnly: the run read no consumer (relay reconcile).
	ProducerOnly bool   `json:"producer_only,omitempty"`
	Window       Window `json:"window"`
	Counts       Counts `json:"counts"`
	// Findings, by stream, then kind. Anomalies counts those that are
	// anomalies (all but resolved gaps).
	Findings  []Finding `json:"findings"`
	Anomalies int       `json:"anomalies"`
}

// Window is what a run judged.
type Window struct {
	// From and Until bound the outbox rows by created_at (Until: the
	// window's end or the run's start less the settle time).
	From   time.Time `json:"from"`
	Until  time.Time `json:"until"`
	FromID int64     `json:"from_id,omitempty"`
	ToID   int64     `json:"to_id,omitempty"`
	// TopicFrom is where the topics were read from (record timestamps);
	// InboxFrom where the inbox was (received_at).
	TopicFrom time.Time `json:"topic_from"`
	InboxFrom time.Time `json:"inbox_from"`
}

// Counts are the totals a run saw.
type Counts struct {
	Streams int `json:"streams"`
	// Committed: outbox rows of the window; Queued: of those, still in the
	// relay's queue (not judged).
	Committed int64 `json:"committed"`
	Queued    int64 `json:"queued"`
	// Records: data records read; Malformed: of those, not an envelope;
	// OtherProducers: of this producer's topics, records of other
	// producers or of legacy streams (judged on the consumer's side only).
	Records        int64 `json:"records"`
	Malformed      int64 `json:"malformed"`
	OtherProducers int64 `json:"other_producers"`
	// Unconsumed: records at or past the consumer's stored offsets (not
	// judged).
	Unconsumed int64 `json:"unconsumed"`
	// Applied, Parked, Dead: inbox rows read (Dead includes held).
	Applied int64 `json:"applied"`
	Parked  int64 `json:"parked"`
	Dead    int64 `json:"dead"`
	// Ranges is the most seq ranges held at once (the memory bound's
	// measure).
	Ranges int `json:"ranges"`
}

// Finding is one kind of anomaly on one stream.
type Finding struct {
	Kind     string `json:"kind"`
	Producer string `json:"producer"`
	Topic    string `json:"topic"`
	Source   string `json:"source"`
	// Seqs are the seqs concerned (at most 100 ranges listed; Count is
	// the total).
	Seqs  []Range `json:"seqs"`
	Count int64   `json:"count"`
	// Detail says what else is known (for a gap: what it skipped).
	Detail string `json:"detail,omitempty"`
	// Resolved: a gap an operator resolved (not an anomaly).
	Resolved bool `json:"resolved,omitempty"`
}

// Clean reports whether the run found no anomaly.
func (r *Report) Clean() bool { return r.Anomalies == 0 }

type streamKey struct{ producer, topic, source string }

func (k streamKey) compare(o streamKey) int {
	return cmp.Or(cmp.Compare(k.topic, o.topic), cmp.Compare(k.source, o.source), cmp.Compare(k.producer, o.producer))
}

// stream is what a run knows of one stream.
type stream struct {
	committed, queued                   Set
	onTopic, unconsumed, twiceOnTopic   Set
	outOfOrder                          Set
	applied, parked, dead, appliedTwice Set
	last                                map[int32]int64 // per partition, the highest seq read
}

type run struct {
	cfg     Config
	rep     *Report
	streams map[streamKey]*stream
	ranges  int
	stored  offsets
	gaps    []gapRow
}

type gapRow struct {
	key      streamKey
	r        Range
	reason   string
	closedAt time.Time
	resolved bool
	note     string
}

// Run reconciles the window of cfg. An error means the run could not
// finish (a database, the topics, the memory bound); anomalies are in the
// report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, streams: map[streamKey]*stream{}, rep: &Report{
		StartedAt: time.Now().UTC(), Consumer: cfg.Consumer, Group: cfg.Group, Topics: slices.Clone(cfg.Topics), ProducerOnly: cfg.ProducerOnly,
		Findings: []Finding{},
	}}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"producing database (outbox)", r.readOutbox},
		{"consumer database (stored offsets)", r.readOffsets},
		{"topics", r.readTopic},
		{"consumer database (inbox, gaps)", r.readInbox},
		{"producing database (edges of the window)", r.judge},
	}
	for _, s := range steps {
		if cfg.ProducerOnly && strings.HasPrefix(s.name, "consumer") {
			continue
		}
		if err := s.fn(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		cfg.Logger.DebugContext(ctx, "reconcile: step done", slog.String("step", s.name), slog.Int("ranges", r.ranges))
	}
	r.rep.Counts.Streams = len(r.streams)
	r.rep.FinishedAt = time.Now().UTC()
	return r.rep, nil
}

func (r *run) stream(k streamKey) (*stream, error) {
	s := r.streams[k]
	if s == nil {
		if err := r.grow(streamCost); err != nil {
			return nil, err
		}
		s = &stream{}
		r.streams[k] = s
	}
	return s, nil
}

func (r *run) grow(n int) error {
	r.ranges += n
	r.rep.Counts.Ranges = max(r.rep.Counts.Ranges, r.ranges)
	if r.ranges > r.cfg.MaxRanges {
		return fmt.Errorf("%w (%d)", ErrTooLarge, r.cfg.MaxRanges)
	}
	return nil
}

// add adds seq to set, counting the ranges it grows by.
func (r *run) add(set *Set, seq int64) error {
	before := set.Ranges()
	set.Add(seq)
	if d := set.Ranges() - before; d != 0 {
		return r.grow(d)
	}
	return nil
}

func readOnly(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

func (r *run) readOutbox(ctx context.Context) error {
	return readOnly(ctx, r.cfg.OutboxPool, func(tx pgx.Tx) error {
		var now time.Time
		if err := tx.QueryRow(ctx, qIdentity).Scan(&r.rep.Producer, &now); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return errors.New("onceflow.database_identity is empty: has `relay migrate` run?")
			}
			return fmt.Errorf("read the database identity: %w", err)
		}
		w := &r.rep.Window
		w.Until = now.Add(-r.cfg.Settle)
		var rows pgx.Rows
		var err error
		if r.cfg.FromID != 0 {
			w.FromID, w.ToID = r.cfg.FromID, r.cfg.ToID
			to := r.cfg.ToID
			if to == 0 {
				to = 1<<63 - 1
			}
			var start *time.Time
			if err := tx.QueryRow(ctx, qIDRangeStart, r.cfg.FromID, to).Scan(&start); err != nil {
				return fmt.Errorf("the id range's first row: %w", err)
			}
			if start == nil {
				w.From = w.Until
			} else {
				w.From = *start
			}
			rows, err = tx.Query(ctx, qOutboxByID, r.cfg.Topics, r.cfg.FromID, to, w.Until)
		} else {
			w.From = r.cfg.From
			if !r.cfg.To.IsZero() && r.cfg.To.Before(w.Until) {
				w.Until = r.cfg.To
			}
			rows, err = tx.Query(ctx, qOutboxByTime, r.cfg.Topics, w.From, w.Until)
		}
		if err != nil {
			return err
		}
		defer rows.Close()
		var k streamKey
		var s *stream
		for rows.Next() {
			var topic, source string
			var seq int64
			var queued bool
			if err := rows.Scan(&topic, &source, &seq, &queued); err != nil {
				return err
			}
			if s == nil || topic != k.topic || source != k.source {
				k = streamKey{producer: r.rep.Producer, topic: topic, source: source}
				if s, err = r.stream(k); err != nil {
					return err
				}
			}
			r.rep.Counts.Committed++
			set := &s.committed
			if queued {
				r.rep.Counts.Queued++
				set = &s.queued
			}
			if err := r.add(set, seq); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// offsets are the consumer's stored next offsets, read before the topic:
// every record below them was applied (or parked, or dead-lettered) in the
// transaction that stored them.
type offsets map[string]map[int32]int64

func (r *run) readOffsets(ctx context.Context) error {
	stored := offsets{}
	err := readOnly(ctx, r.cfg.ConsumerPool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, qOffsets, r.cfg.Group, r.cfg.Topics)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var topic string
			var p int32
			var next int64
			if err := rows.Scan(&topic, &p, &next); err != nil {
				return err
			}
			if stored[topic] == nil {
				stored[topic] = map[int32]int64{}
			}
			stored[topic][p] = next
		}
		return rows.Err()
	})
	r.stored = stored
	return err
}

func (r *run) readTopic(ctx context.Context) error {
	w := &r.rep.Window
	w.TopicFrom = w.From.Add(-r.cfg.ClockMargin)
	n, err := readTopics(ctx, r.cfg.KafkaOpts, r.cfg.Topics, w.TopicFrom, func(rec record) error {
		env, err := envelope.Decode(rec.rec, 0)
		if err != nil {
			r.rep.Counts.Malformed++
			return nil
		}
		if env.Producer != r.rep.Producer {
			r.rep.Counts.OtherProducers++
			if r.cfg.ProducerOnly {
				return nil // another relay's records: not this run's to judge
			}
		}
		s, err := r.stream(streamKey{producer: env.Producer, topic: rec.topic, source: env.Source})
		if err != nil {
			return err
		}
		next, ok := r.stored[rec.topic][rec.partition]
		if !r.cfg.ProducerOnly && (!ok || rec.offset >= next) {
			r.rep.Counts.Unconsumed++
			if err := r.add(&s.unconsumed, env.Seq); err != nil {
				return err
			}
		}
		if s.onTopic.Contains(env.Seq) {
			return r.add(&s.twiceOnTopic, env.Seq)
		}
		if s.last == nil {
			s.last = map[int32]int64{}
		}
		if last, ok := s.last[rec.partition]; ok && env.Seq < last {
			if err := r.add(&s.outOfOrder, env.Seq); err != nil {
				return err
			}
		}
		s.last[rec.partition] = max(s.last[rec.partition], env.Seq)
		return r.add(&s.onTopic, env.Seq)
	})
	r.rep.Counts.Records = n
	return err
}

func (r *run) readInbox(ctx context.Context) error {
	w := &r.rep.Window
	w.InboxFrom = w.TopicFrom.Add(-r.cfg.ClockMargin)
	return readOnly(ctx, r.cfg.ConsumerPool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, qInbox, r.cfg.Consumer, r.cfg.Topics, w.InboxFrom)
		if err != nil {
			return err
		}
		var k streamKey
		var s *stream
		prevSeq := int64(-1)
		for rows.Next() {
			var nk streamKey
			var seq int64
			var status string
			if err := rows.Scan(&nk.producer, &nk.topic, &nk.source, &seq, &status); err != nil {
				rows.Close()
				return err
			}
			if s == nil || nk != k {
				// Only streams seen on the topic are judged.
				k, s, prevSeq = nk, r.streams[nk], -1
				if s == nil {
					s = &stream{} // a throwaway: not on the topic in the window
				}
			}
			var set *Set
			switch status {
			case "processed":
				r.rep.Counts.Applied++
				set = &s.applied
				if seq == prevSeq {
					set = &s.appliedTwice
				}
				prevSeq = seq
			case "parked":
				r.rep.Counts.Parked++
				set = &s.parked
			default:
				r.rep.Counts.Dead++
				set = &s.dead
			}
			if r.streams[k] == nil {
				continue
			}
			if err := r.add(set, seq); err != nil {
				rows.Close()
				return err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		gaps, err := tx.Query(ctx, qGivenUp, r.cfg.Consumer, w.InboxFrom, r.cfg.Topics)
		if err != nil {
			return err
		}
		defer gaps.Close()
		for gaps.Next() {
			var g gapRow
			if err := gaps.Scan(&g.key.producer, &g.key.topic, &g.key.source, &g.r.From, &g.r.To, &g.reason, &g.closedAt,
				&g.resolved, &g.note); err != nil {
				return err
			}
			r.gaps = append(r.gaps, g)
			if err := r.grow(1); err != nil {
				return err
			}
		}
		return gaps.Err()
	})
}

// judge turns the sets into findings, looking up in the producing database
// the seqs that only the window's edges could explain.
func (r *run) judge(ctx context.Context) error {
	keys := make([]streamKey, 0, len(r.streams))
	for k := range r.streams {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, streamKey.compare)
	for _, k := range keys {
		s := r.streams[k]
		if k.producer == r.rep.Producer && !r.cfg.ConsumerOnly {
			if err := r.judgeProducer(ctx, k, s); err != nil {
				return err
			}
		}
		r.find(k, OutOfOrder, &s.outOfOrder, "a record with a lower seq came after a higher one in its partition")
		r.find(k, PublishedTwice, &s.twiceOnTopic, "the seq is on the topic more than once (the inbox applies it once)")
		if r.cfg.ProducerOnly {
			continue
		}
		judged := s.onTopic.Minus(&s.unconsumed)
		missing := judged.Minus(&s.applied, &s.parked)
		if !missing.Empty() {
			detail := "below the consumer's stored offset, and no applied or parked inbox row"
			if dead := missing.Intersect(&s.dead); !dead.Empty() {
				detail += fmt.Sprintf("; %d of them dead-lettered or held (consumer dlq list)", dead.Len())
			}
			r.find(k, PublishedNotApplied, missing, detail)
		}
		r.find(k, AppliedTwice, &s.appliedTwice, "two applied inbox rows (different event ids) for one seq of the stream")
	}
	for _, g := range r.gaps {
		if err := r.judgeGap(ctx, g); err != nil {
			return err
		}
	}
	slices.SortStableFunc(r.rep.Findings, func(a, b Finding) int {
		return streamKey{a.Producer, a.Topic, a.Source}.compare(streamKey{b.Producer, b.Topic, b.Source})
	})
	return nil
}

func (r *run) judgeProducer(ctx context.Context, k streamKey, s *stream) error {
	// Committed, no longer queued, and not on the topic.
	if lost := s.committed.Minus(&s.onTopic); !lost.Empty() {
		logged, err := r.countLogged(ctx, k, lost)
		if err != nil {
			return err
		}
		detail := fmt.Sprintf("the publish log names %d of them as published", logged)
		if n := lost.Len() - logged; n > 0 {
			detail += fmt.Sprintf("; %d are neither queued nor logged (written while the outbox's triggers did not fire? the relay's sweep queues those)", n)
		}
		r.find(k, CommittedNotPublished, lost, detail)
	}
	// On the topic, and not among the window's rows: look each range up
	// (the row may be older than the window, or newer than its settle
	// time).
	cand := s.onTopic.Minus(&s.committed, &s.queued)
	if cand.Empty() {
		return nil
	}
	found := &Set{}
	err := readOnly(ctx, r.cfg.OutboxPool, func(tx pgx.Tx) error {
		for _, rg := range cand.All() {
			rows, err := tx.Query(ctx, qStreamRows, k.topic, k.source, rg.From, rg.To)
			if err != nil {
				return err
			}
			for rows.Next() {
				var seq int64
				var logged bool
				if err := rows.Scan(&seq, &logged); err != nil {
					rows.Close()
					return err
				}
				if err := r.add(found, seq); err != nil {
					rows.Close()
					return err
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.find(k, PublishedNeverCommitted, cand.Minus(found),
		"a record with this database's producer header, but no outbox row has its topic, source and seq (deleted after publishing, pruned, or never written by a relay of this database)")
	return nil
}

// countLogged counts the seqs of set whose rows the publish log names.
func (r *run) countLogged(ctx context.Context, k streamKey, set *Set) (int64, error) {
	var n int64
	err := readOnly(ctx, r.cfg.OutboxPool, func(tx pgx.Tx) error {
		for _, rg := range set.All() {
			rows, err := tx.Query(ctx, qStreamRows, k.topic, k.source, rg.From, rg.To)
			if err != nil {
				return err
			}
			for rows.Next() {
				var seq int64
				var logged bool
				if err := rows.Scan(&seq, &logged); err != nil {
					rows.Close()
					return err
				}
				if logged {
					n++
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
		}
		return nil
	})
	return n, err
}

// judgeGap reports a given-up gap with what it skipped.
func (r *run) judgeGap(ctx context.Context, g gapRow) error {
	span := &Set{}
	span.AddRange(g.r.From, g.r.To)
	var onTopic, applied, inOutbox, skipped int64
	topics := []string{g.key.topic}
	if g.key.topic == "" { // a legacy stream: the source across topics
		topics = r.cfg.Topics
	}
	for _, t := range topics {
		if s := r.streams[streamKey{g.key.producer, t, g.key.source}]; s != nil {
			onTopic += span.Intersect(&s.onTopic).Len()
			applied += span.Intersect(&s.applied).Len()
		}
	}
	if g.key.producer == r.rep.Producer {
		err := readOnly(ctx, r.cfg.OutboxPool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, qStreamRows, g.key.topic, g.key.source, g.r.From, g.r.To)
			if err != nil {
				return err
			}
			for rows.Next() {
				inOutbox++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			return tx.QueryRow(ctx, qSkipped, g.key.topic, g.key.source, g.r.From, g.r.To).Scan(&skipped)
		})
		if err != nil {
			return err
		}
	}
	detail := fmt.Sprintf("given up (%s) at %s; skipped %d seqs: %d on the topic, %d applied later, ",
		g.reason, g.closedAt.UTC().Format(time.RFC3339), span.Len(), onTopic, applied)
	if g.key.producer == r.rep.Producer {
		detail += fmt.Sprintf("%d in the outbox, %d skipped by an operator (relay outbox failed skip)", inOutbox, skipped)
	} else {
		detail += "the outbox not read (another producer's stream)"
	}
	if g.resolved {
		detail += "; resolved: " + g.note
	}
	f := Finding{Kind: GapGivenUp, Producer: g.key.producer, Topic: g.key.topic, Source: g.key.source,
		Seqs: []Range{g.r}, Count: span.Len(), Detail: detail, Resolved: g.resolved}
	r.rep.Findings = append(r.rep.Findings, f)
	if !g.resolved {
		r.rep.Anomalies++
	}
	return nil
}

func (r *run) find(k streamKey, kind string, set *Set, detail string) {
	if set.Empty() {
		return
	}
	rs := set.All()
	if len(rs) > maxListedRanges {
		rs = rs[:maxListedRanges]
	}
	r.rep.Findings = append(r.rep.Findings, Finding{Kind: kind, Producer: k.producer, Topic: k.topic, Source: k.source,
		Seqs: slices.Clone(rs), Count: set.Len(), Detail: detail})
	r.rep.Anomalies++
}
