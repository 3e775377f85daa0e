package soak

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/internal/reconcile"
)

// Anomaly kinds: each breaks a guarantee.
const (
	AnomalyLost       = "lost"         // committed, never on the topic or never applied
	AnomalyDuplicate  = "duplicate"    // on the topic or applied more than once
	AnomalyReordered  = "reordered"    // a source's seqs out of order on the topic or in application
	AnomalyPhantom    = "phantom"      // on the topic or applied, never committed (e.g. rolled back)
	AnomalyGapGivenUp = "gap-given-up" // a sequence gap given up although its events were committed
	AnomalyLate       = "late"         // applied as late: only a given-up gap makes an event late
	AnomalyDead       = "dead-lettered"
	AnomalyStuck      = "stuck" // parked or held in the inbox, or a gap still open, after the drain
	AnomalyMalformed  = "malformed"
	AnomalySeqHole    = "seq-hole"       // a source's committed seqs are not 1..n
	AnomalyPartialTxn = "partial-commit" // a producer transaction committed in part
	// AnomalyTally is a stream whose soak-tally counter disagrees with the
	// ledger: the counting handler applied an event twice or missed one.
	AnomalyTally = "tally-mismatch"
	// AnomalyReconcile prefixes a finding of the reconcile check (e.g.
	// "reconcile:committed_not_published"); alone, the check could not run.
	AnomalyReconcile = "reconcile"
	maxExamples      = 5
	whereTopic       = "topic"
	whereApplied     = "applied"
	whereInbox       = "inbox"
	whereProducer    = "producer"
	whereReconcile   = "reconcile"
	// reconcileWindow is how far back the reconcile check looks: well
	// within the relay's default retention (outbox.DefaultRetention).
	reconcileWindow    = 40 * time.Minute
	whereSeqGaps       = "seq_gaps"
	appliedScanTimeout = 10 * time.Minute
)

// Anomaly is one kind of broken guarantee found where, with examples.
type Anomaly struct {
	Kind     string   `json:"kind"`
	Where    string   `json:"where"`
	Count    int      `json:"count"`
	Examples []string `json:"examples"`
}

// appliedWatch judges the applied side effects in the order they were
// applied.
type appliedWatch struct {
	seq       *audit.Sequence
	late      []string
	dupes     []string
	reordered []string
	firstAt   map[string]string
	// The event ids of dupes and reordered, for the per-fault table.
	dupeIDs, reorderedIDs []string
}

func newAppliedWatch() *appliedWatch {
	return &appliedWatch{seq: audit.NewSequence(), firstAt: map[string]string{}}
}

// appliedRow is one row of soak.effects.
type appliedRow struct {
	n, seq, offset  int64
	id, source      string
	producer, topic string // the producing database's name, the topic ("" in unit tests)
	late            bool
	partition       int32
}

func (w *appliedWatch) add(a appliedRow) {
	at := fmt.Sprintf("row %d from %s/%d/%d", a.n, a.topic, a.partition, a.offset)
	stream := a.source
	if a.producer != "" || a.topic != "" {
		stream = streamKey(a.producer, a.topic, a.source)
	}
	if a.late {
		w.late = append(w.late, fmt.Sprintf("%s (%s seq %d) %s", a.id, stream, a.seq, at))
		w.seq.Count[a.id]++
		w.seq.Total++
	} else if w.seq.Add(a.id, stream, a.seq) {
		w.reordered = append(w.reordered, fmt.Sprintf("%s: seq %d (%s) %s after seq %d", stream, a.seq, a.id, at, w.seq.LastSeq(stream)))
		w.reorderedIDs = append(w.reorderedIDs, a.id)
	}
	if f, ok := w.firstAt[a.id]; ok {
		w.dupes = append(w.dupes, fmt.Sprintf("%s (%s seq %d) %s, first %s", a.id, a.source, a.seq, at, f))
		w.dupeIDs = append(w.dupeIDs, a.id)
	} else {
		w.firstAt[a.id] = at
	}
}

// inboxRow is an inbox row that is not processed; gapRow a given-up or
// open sequence gap.
type inboxRow struct {
	id, source, status, lastError string
	seq                           int64
}

type gapRow struct {
	// stream is the ledger's key of the gap's stream (streamKey; unit
	// tests leave it empty: the source with no database or topic).
	stream                string
	source, state, reason string
	from, to              int64
	openedAt              time.Duration // since the start of the run
}

// findAnomalies judges everything the run saw against the producers'
// ledger. It is pure: the tests feed it broken runs.
func findAnomalies(l *ledger, tw *topicWatch, aw *appliedWatch, inbox []inboxRow, gaps []gapRow) []Anomaly {
	var out []Anomaly
	add := func(kind, where string, items []string) {
		if len(items) == 0 {
			return
		}
		out = append(out, Anomaly{Kind: kind, Where: where, Count: len(items), Examples: first(items, maxExamples)})
	}
	l.mu.Lock()
	committed := make(map[string]bool, len(l.committed))
	for id := range l.committed {
		committed[id] = true
	}
	var holes []string
	for src, seqs := range l.seqs {
		s := append([]int64(nil), seqs...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		for i, v := range s {
			if v != int64(i+1) {
				holes = append(holes, fmt.Sprintf("%s: seq %d where %d was expected (%d committed)", src, v, i+1, len(s)))
				break
			}
		}
	}
	sort.Strings(holes)
	partial := append([]string(nil), l.partial...)
	l.mu.Unlock()
	add(AnomalySeqHole, whereProducer, holes)
	add(AnomalyPartialTxn, whereProducer, partial)
	label := func(ids []string) []string {
		out := make([]string, len(ids))
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, id := range ids {
			if l.rolledBack[id] {
				out[i] = id + " (rolled back)"
			} else {
				out[i] = id + " (never enqueued)"
			}
		}
		return out
	}

	tw.mu.Lock()
	lost, _, phantom := tw.seq.Diff(committed)
	add(AnomalyLost, whereTopic, withSource(lost, l))
	add(AnomalyDuplicate, whereTopic, tw.dupes)
	add(AnomalyReordered, whereTopic, tw.reordered)
	add(AnomalyPhantom, whereTopic, label(phantom))
	add(AnomalyMalformed, whereTopic, tw.malformed)
	tw.mu.Unlock()
	return append(out, consumerAnomalies(l, committed, "", aw, inbox, gaps)...)
}

// consumerAnomalies judges what one consumer name applied, its inbox and
// its gaps; suffix tells its findings apart from another consumer's
// ("" for the first).
func consumerAnomalies(l *ledger, committed map[string]bool, suffix string, aw *appliedWatch, inbox []inboxRow, gaps []gapRow) []Anomaly {
	var out []Anomaly
	add := func(kind, where string, items []string) {
		if len(items) == 0 {
			return
		}
		out = append(out, Anomaly{Kind: kind, Where: where + suffix, Count: len(items), Examples: first(items, maxExamples)})
	}
	label := func(ids []string) []string {
		out := make([]string, len(ids))
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, id := range ids {
			if l.rolledBack[id] {
				out[i] = id + " (rolled back)"
			} else {
				out[i] = id + " (never enqueued)"
			}
		}
		return out
	}
	lost, _, phantom := aw.seq.Diff(committed)
	add(AnomalyLost, whereApplied, withSource(lost, l))
	add(AnomalyDuplicate, whereApplied, aw.dupes)
	add(AnomalyReordered, whereApplied, aw.reordered)
	add(AnomalyPhantom, whereApplied, label(phantom))
	add(AnomalyLate, whereApplied, aw.late)

	var dead, stuck []string
	for _, r := range inbox {
		x := fmt.Sprintf("%s (%s seq %d) %s %s", r.id, r.source, r.seq, r.status, r.lastError)
		if r.status == "dead" {
			dead = append(dead, x)
		} else {
			stuck = append(stuck, x)
		}
	}
	add(AnomalyDead, whereInbox, dead)
	add(AnomalyStuck, whereInbox, stuck)

	var givenUp, open []string
	for _, g := range gaps {
		stream := g.stream
		if stream == "" {
			stream = streamKey("", "", g.source)
		}
		l.mu.Lock()
		n := int64(len(l.seqs[stream]))
		l.mu.Unlock()
		missing := 0
		for s := g.from; s <= g.to; s++ {
			if s > n {
				missing++
			}
		}
		desc := fmt.Sprintf("%s seq %d–%d opened at %s", stream, g.from, g.to, g.openedAt.Round(time.Second))
		if missing == 0 {
			desc += ", every event of it committed"
		} else {
			desc += fmt.Sprintf(", %d of them never committed", missing)
		}
		if g.state == "open" {
			open = append(open, desc)
		} else {
			givenUp = append(givenUp, desc+" ("+g.reason+")")
		}
	}
	add(AnomalyGapGivenUp, whereSeqGaps, givenUp)
	add(AnomalyStuck, whereSeqGaps, open)
	return out
}

// judge reads the rest of the topics, each consumer name's applied side
// effects, inbox and gaps, and builds the report.
func (r *run) judge(ctx context.Context) (*Report, error) {
	rep := &Report{Seed: r.cfg.Seed, Rate: r.cfg.Rate, DurationS: r.cfg.Duration.Seconds(),
		FaultIntervalS: r.cfg.FaultInterval.Seconds(), StartedAt: r.start, Command: r.cfg.Command}
	l := r.led
	l.mu.Lock()
	rep.Events = EventCounts{
		Committed: l.n.Load(), RolledBack: l.rb.Load(), ViaSQL: l.viaSQL.Load(), Transactions: l.txns.Load(),
		LongTransactions: l.longTxns.Load(), UnknownCommitOutcomes: int64(l.unknown), Retries: l.retries.Load(),
		Streams: len(l.seqs), Snapshots: l.snapshots.Load(), SnapshotSeconds: float64(l.snapshotMs.Load()) / 1000,
	}
	sources := map[string]bool{}
	byDB := map[string]int64{}
	for _, e := range l.committed {
		sources[e.source] = true
		byDB[e.db]++
	}
	rep.Events.Sources = len(sources)
	rep.Events.ByDatabase = byDB
	l.mu.Unlock()

	// The topics, read with read_committed to their last stable offsets.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	err := r.topic.readToStable(rctx)
	cancel()
	if err != nil {
		rep.Notes = append(rep.Notes, "topics not read to their end: "+err.Error())
	}
	r.topic.mu.Lock()
	rep.Events.OnTopic = int64(r.topic.seq.Total)
	rep.Events.OnTopicDistinct = int64(len(r.topic.seq.Count))
	r.topic.mu.Unlock()

	actx, cancel := context.WithTimeout(ctx, appliedScanTimeout)
	defer cancel()
	var main *appliedWatch
	for i, name := range consumerNames {
		aw, inbox, gaps, err := r.readConsumer(actx, name)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			main = aw
			rep.Events.Applied = int64(aw.seq.Total)
			rep.Events.AppliedDistinct = int64(len(aw.seq.Count))
			rep.Events.Late = int64(len(aw.late))
			rep.Anomalies = findAnomalies(l, r.topic, aw, inbox, gaps)
			continue
		}
		rep.Events.AppliedBy = map[string]int64{name: int64(aw.seq.Total)}
		l.mu.Lock()
		committed := make(map[string]bool, len(l.committed))
		for id := range l.committed {
			committed[id] = true
		}
		l.mu.Unlock()
		rep.Anomalies = append(rep.Anomalies, consumerAnomalies(l, committed, " ("+name+")", aw, inbox, gaps)...)
	}
	if rep.Events.AppliedBy == nil {
		rep.Events.AppliedBy = map[string]int64{}
	}
	rep.Events.AppliedBy[consumerID] = rep.Events.Applied
	tally, err := r.readTally(actx)
	if err != nil {
		return nil, err
	}
	rep.Anomalies = append(rep.Anomalies, tallyAnomalies(l, tally)...)
	rep.Anomalies = append(rep.Anomalies, r.reconcile(ctx, rep)...)
	rep.Anomalies = append(rep.Anomalies, r.checkReplica(ctx, r.judgedFrom(), rep)...)

	// Faults and recovery.
	r.faultsMu.Lock()
	rep.Faults = append([]Fault(nil), r.faults...)
	r.faultsMu.Unlock()
	rep.summarizeFaults()
	if len(r.unavailable) > 0 {
		rep.Unavailable = r.unavailable
	}
	rep.ByFault = byFault(l, r.topic, main, rep.Faults, r.start)
	rep.Latency = durationStats(r.probes.latencySnapshot())
	r.exitsMu.Lock()
	rep.UnexpectedExits = append([]string(nil), r.exits...)
	r.exitsMu.Unlock()
	rep.Series = r.series.all()
	for _, d := range r.dbs {
		rep.ProducerErrors += d.prod.errs.Load()
		if e := d.prod.lastErr.Load(); e != nil {
			rep.LastProducerError = *e
		}
	}
	rep.TopicPollErrors = r.topic.pollErrs.Load()
	rep.OK = len(rep.Anomalies) == 0
	return rep, nil
}

// readConsumer reads what consumer name applied (soak.effects, in the
// order applied), its inbox rows that are not processed, and its given-up
// or open gaps.
func (r *run) readConsumer(ctx context.Context, name string) (*appliedWatch, []inboxRow, []gapRow, error) {
	aw := newAppliedWatch()
	rows, err := r.pool.Query(ctx, `SELECT n, event_id, producer, topic, source, seq, late, kafka_partition, kafka_offset
		FROM soak.effects WHERE consumer = $1 ORDER BY n`, name)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read soak.effects of %s: %w", name, err)
	}
	for rows.Next() {
		var a appliedRow
		if err := rows.Scan(&a.n, &a.id, &a.producer, &a.topic, &a.source, &a.seq, &a.late, &a.partition, &a.offset); err != nil {
			rows.Close()
			return nil, nil, nil, err
		}
		aw.add(a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, nil, fmt.Errorf("read soak.effects of %s: %w", name, err)
	}
	var inbox []inboxRow
	irows, err := r.pool.Query(ctx, `SELECT event_id, source, coalesce(seq, 0), status, coalesce(last_error, '')
		FROM onceflow.inbox WHERE consumer = $1 AND status <> 'processed' ORDER BY received_at`, name)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read inbox of %s: %w", name, err)
	}
	for irows.Next() {
		var x inboxRow
		if err := irows.Scan(&x.id, &x.source, &x.seq, &x.status, &x.lastError); err != nil {
			irows.Close()
			return nil, nil, nil, err
		}
		inbox = append(inbox, x)
	}
	irows.Close()
	var gaps []gapRow
	grows, err := r.pool.Query(ctx, `SELECT producer, topic, source, from_seq, to_seq, state, coalesce(give_up_reason, ''), opened_at
		FROM onceflow.seq_gaps WHERE consumer = $1 AND state IN ('given_up', 'open') ORDER BY id`, name)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read seq_gaps of %s: %w", name, err)
	}
	for grows.Next() {
		var g gapRow
		var producer, topic string
		var opened time.Time
		if err := grows.Scan(&producer, &topic, &g.source, &g.from, &g.to, &g.state, &g.reason, &opened); err != nil {
			grows.Close()
			return nil, nil, nil, err
		}
		if db, ok := r.identities[producer]; ok {
			producer = db
		}
		g.stream = streamKey(producer, topic, g.source)
		g.openedAt = opened.Sub(r.start)
		gaps = append(gaps, g)
	}
	grows.Close()
	return aw, inbox, gaps, grows.Err()
}

// tallyRow is soak-tally's counter of one stream.
type tallyRow struct {
	stream string
	n, max int64
}

func (r *run) readTally(ctx context.Context) ([]tallyRow, error) {
	rows, err := r.pool.Query(ctx, `SELECT producer, topic, source, n, max_seq FROM soak.tally`)
	if err != nil {
		return nil, fmt.Errorf("read soak.tally: %w", err)
	}
	defer rows.Close()
	var out []tallyRow
	for rows.Next() {
		var db, topic, source string
		var t tallyRow
		if err := rows.Scan(&db, &topic, &source, &t.n, &t.max); err != nil {
			return nil, err
		}
		t.stream = streamKey(db, topic, source)
		out = append(out, t)
	}
	return out, rows.Err()
}

// tallyAnomalies compares soak-tally's counters with the ledger: each
// stream counted exactly as many times as it committed events, up to its
// last seq.
func tallyAnomalies(l *ledger, tally []tallyRow) []Anomaly {
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := map[string]bool{}
	var bad []string
	for _, t := range tally {
		seen[t.stream] = true
		want := int64(len(l.seqs[t.stream]))
		if t.n != want || t.max != want {
			bad = append(bad, fmt.Sprintf("%s: counted %d up to seq %d, committed %d", t.stream, t.n, t.max, want))
		}
	}
	for stream, seqs := range l.seqs {
		if !seen[stream] && len(seqs) > 0 {
			bad = append(bad, fmt.Sprintf("%s: never counted, committed %d", stream, len(seqs)))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return []Anomaly{{Kind: AnomalyTally, Where: whereApplied + " (" + tallyID + ")", Count: len(bad), Examples: first(bad, maxExamples)}}
}

// reconcileClockMargin is how far before the window reconcile reads the
// topics (by record timestamp): past the clock-skew fault's largest skew
// (2 minutes behind) and a fault's delay in publishing; the command's
// default.
const reconcileClockMargin = 5 * time.Minute

// reconcile runs the check of `consumer reconcile` (internal/reconcile) for
// every producing database and consumer name: the judge's second opinion,
// from the outbox, the topics and the inbox alone, without the ledger. Each
// finding (or a run that could not finish) is an anomaly. It covers the
// whole run, or its last reconcileWindow when the run is longer: the relay
// prunes published rows after its retention (an hour), and a pruned row's
// record would look never committed.
func (r *run) reconcile(ctx context.Context, rep *Report) []Anomaly {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	from := r.judgedFrom()
	if from.After(r.start.Add(-time.Minute)) {
		rep.Notes = append(rep.Notes, fmt.Sprintf("reconcile judged the events committed from %s on (the relay prunes older ones)", from.UTC().Format(time.RFC3339)))
	}
	var out []Anomaly
	sum := &ReconcileSummary{}
	groups := map[string]string{consumerID: group, tallyID: tallyGroup}
	for _, d := range r.dbs {
		for _, name := range consumerNames {
			rr, err := reconcile.Run(ctx, reconcile.Config{ClockMargin: reconcileClockMargin, Consumer: name, ConsumerPool: r.pool,
				From: from, Group: groups[name], KafkaOpts: r.kc.internalOpts(), OutboxPool: d.pool,
				Settle: -1, Topics: eventTopics})
			where := fmt.Sprintf("%s (database %s, consumer %s)", whereReconcile, d.name, name)
			if err != nil {
				out = append(out, Anomaly{Kind: AnomalyReconcile, Where: where, Count: 1, Examples: []string{"could not run: " + err.Error()}})
				continue
			}
			run := ReconcileRun{Database: d.name, Consumer: name, Counts: rr.Counts, Anomalies: rr.Anomalies,
				Seconds: rr.FinishedAt.Sub(rr.StartedAt).Seconds()}
			rep.Reconciles = append(rep.Reconciles, run)
			if name == consumerID {
				sum.add(run)
			}
			for _, f := range rr.Findings {
				if f.Resolved {
					continue
				}
				set := reconcile.Set{}
				for _, x := range f.Seqs {
					set.AddRange(x.From, x.To)
				}
				out = append(out, Anomaly{Kind: AnomalyReconcile + ":" + f.Kind, Where: where, Count: int(f.Count),
					Examples: []string{fmt.Sprintf("%s/%s of producer %s seqs %s: %s", f.Topic, f.Source, shortID(f.Producer), set.String(), f.Detail)}})
			}
		}
	}
	if len(rep.Reconciles) > 0 {
		rep.Reconcile = sum
	}
	return out
}

// judgedFrom is where the reconcile and replica checks begin: the run's
// start, or reconcileWindow ago when the run is longer.
func (r *run) judgedFrom() time.Time {
	from := r.start.Add(-time.Minute)
	if w := time.Now().Add(-reconcileWindow); w.After(from) {
		from = w
	}
	return from
}

// withSource adds the source and seq to committed event ids.
func withSource(ids []string, l *ledger) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(ids))
	for i, id := range ids {
		e := l.committed[id]
		out[i] = fmt.Sprintf("%s (%s seq %d)", id, e.source, e.seq)
	}
	return out
}

func first(s []string, n int) []string {
	if len(s) > n {
		return append([]string(nil), s[:n]...)
	}
	return append([]string(nil), s...)
}

// shortID is a database identity's first 8 characters (a UUID's first
// group), enough to tell the soak's producing databases apart.
func shortID(id string) string {
	if id == "" {
		return "(legacy)"
	}
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
