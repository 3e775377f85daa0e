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
	n, seq, offset int64
	id, source     string
	late           bool
	partition      int32
}

func (w *appliedWatch) add(a appliedRow) {
	at := fmt.Sprintf("row %d from %d/%d", a.n, a.partition, a.offset)
	if a.late {
		w.late = append(w.late, fmt.Sprintf("%s (%s seq %d) %s", a.id, a.source, a.seq, at))
		w.seq.Count[a.id]++
		w.seq.Total++
	} else if w.seq.Add(a.id, a.source, a.seq) {
		w.reordered = append(w.reordered, fmt.Sprintf("%s: seq %d (%s) %s after seq %d", a.source, a.seq, a.id, at, w.seq.LastSeq(a.source)))
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

	lost, _, phantom = aw.seq.Diff(committed)
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
		l.mu.Lock()
		n := int64(len(l.seqs[g.source]))
		l.mu.Unlock()
		missing := 0
		for s := g.from; s <= g.to; s++ {
			if s > n {
				missing++
			}
		}
		desc := fmt.Sprintf("%s seq %d–%d opened at %s", g.source, g.from, g.to, g.openedAt.Round(time.Second))
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

// judge reads the rest of the topic, the applied side effects, the inbox
// and the gaps, and builds the report.
func (r *run) judge(ctx context.Context) (*Report, error) {
	rep := &Report{Seed: r.cfg.Seed, Rate: r.cfg.Rate, DurationS: r.cfg.Duration.Seconds(),
		FaultIntervalS: r.cfg.FaultInterval.Seconds(), StartedAt: r.start, Command: r.cfg.Command}
	l := r.led
	l.mu.Lock()
	rep.Events = EventCounts{
		Committed: l.n.Load(), RolledBack: l.rb.Load(), ViaSQL: l.viaSQL.Load(), Transactions: l.txns.Load(),
		LongTransactions: l.longTxns.Load(), UnknownCommitOutcomes: int64(l.unknown), Retries: l.retries.Load(),
		Sources: len(l.seqs),
	}
	l.mu.Unlock()

	// The topic, read with read_committed to its last stable offset.
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	err := r.topic.r.ReadToStable(rctx)
	cancel()
	if err != nil {
		rep.Notes = append(rep.Notes, "topic not read to its end: "+err.Error())
	}
	r.topic.mu.Lock()
	rep.Events.OnTopic = int64(r.topic.seq.Total)
	rep.Events.OnTopicDistinct = int64(len(r.topic.seq.Count))
	r.topic.mu.Unlock()

	// The applied side effects, in the order they were applied.
	actx, cancel := context.WithTimeout(ctx, appliedScanTimeout)
	defer cancel()
	aw := newAppliedWatch()
	rows, err := r.pool.Query(actx, `SELECT n, event_id, source, seq, late, kafka_partition, kafka_offset FROM soak.effects ORDER BY n`)
	if err != nil {
		return nil, fmt.Errorf("read soak.effects: %w", err)
	}
	for rows.Next() {
		var a appliedRow
		if err := rows.Scan(&a.n, &a.id, &a.source, &a.seq, &a.late, &a.partition, &a.offset); err != nil {
			rows.Close()
			return nil, err
		}
		aw.add(a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read soak.effects: %w", err)
	}
	rep.Events.Applied = int64(aw.seq.Total)
	rep.Events.AppliedDistinct = int64(len(aw.seq.Count))
	rep.Events.Late = int64(len(aw.late))

	// The inbox rows that are not processed, and the gaps.
	var inbox []inboxRow
	irows, err := r.pool.Query(actx, `SELECT event_id, source, coalesce(seq, 0), status, coalesce(last_error, '')
		FROM onceflow.inbox WHERE consumer = $1 AND status <> 'processed' ORDER BY received_at`, consumerID)
	if err != nil {
		return nil, fmt.Errorf("read inbox: %w", err)
	}
	for irows.Next() {
		var x inboxRow
		if err := irows.Scan(&x.id, &x.source, &x.seq, &x.status, &x.lastError); err != nil {
			irows.Close()
			return nil, err
		}
		inbox = append(inbox, x)
	}
	irows.Close()
	var gaps []gapRow
	grows, err := r.pool.Query(actx, `SELECT source, from_seq, to_seq, state, coalesce(give_up_reason, ''), opened_at
		FROM onceflow.seq_gaps WHERE consumer = $1 AND state IN ('given_up', 'open') ORDER BY id`, consumerID)
	if err != nil {
		return nil, fmt.Errorf("read seq_gaps: %w", err)
	}
	for grows.Next() {
		var g gapRow
		var opened time.Time
		if err := grows.Scan(&g.source, &g.from, &g.to, &g.state, &g.reason, &opened); err != nil {
			grows.Close()
			return nil, err
		}
		g.openedAt = opened.Sub(r.start)
		gaps = append(gaps, g)
	}
	grows.Close()
	rep.Anomalies = findAnomalies(l, r.topic, aw, inbox, gaps)
	rep.Anomalies = append(rep.Anomalies, r.reconcile(ctx, rep)...)

	// Faults and recovery.
	r.faultsMu.Lock()
	rep.Faults = append([]Fault(nil), r.faults...)
	r.faultsMu.Unlock()
	rep.summarizeFaults()
	rep.ByFault = byFault(l, r.topic, aw, rep.Faults, r.start)
	rep.Latency = durationStats(r.probes.latencySnapshot())
	r.exitsMu.Lock()
	rep.UnexpectedExits = append([]string(nil), r.exits...)
	r.exitsMu.Unlock()
	rep.Series = r.series.all()
	rep.ProducerErrors = r.prod.errs.Load()
	if e := r.prod.lastErr.Load(); e != nil {
		rep.LastProducerError = *e
	}
	rep.TopicPollErrors = r.topic.pollErrs.Load()
	rep.OK = len(rep.Anomalies) == 0
	return rep, nil
}

// reconcile runs the check of `consumer reconcile` (internal/reconcile): the
// judge's second opinion, from the outbox, the topic and the inbox alone,
// without the ledger. Each finding (or a run that could not finish) is an
// anomaly. It covers the whole run, or its last reconcileWindow when the
// run is longer: the relay prunes published rows after its retention (an
// hour), and a pruned row's record would look never committed.
func (r *run) reconcile(ctx context.Context, rep *Report) []Anomaly {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	from := r.start.Add(-time.Minute)
	if w := time.Now().Add(-reconcileWindow); w.After(from) {
		from = w
		rep.Notes = append(rep.Notes, fmt.Sprintf("reconcile judged the events committed from %s on (the relay prunes older ones)", from.UTC().Format(time.RFC3339)))
	}
	rr, err := reconcile.Run(ctx, reconcile.Config{ClockMargin: time.Minute, Consumer: consumerID, ConsumerPool: r.pool,
		From: from, Group: group, KafkaOpts: r.kc.internalOpts(), OutboxPool: r.pool,
		Settle: -1, Topics: []string{eventTopic}})
	if err != nil {
		return []Anomaly{{Kind: AnomalyReconcile, Where: whereReconcile, Count: 1, Examples: []string{"could not run: " + err.Error()}}}
	}
	rep.Reconcile = &ReconcileSummary{Counts: rr.Counts, Anomalies: rr.Anomalies, Seconds: rr.FinishedAt.Sub(rr.StartedAt).Seconds()}
	var out []Anomaly
	for _, f := range rr.Findings {
		if f.Resolved {
			continue
		}
		set := reconcile.Set{}
		for _, x := range f.Seqs {
			set.AddRange(x.From, x.To)
		}
		out = append(out, Anomaly{Kind: AnomalyReconcile + ":" + f.Kind, Where: whereReconcile, Count: int(f.Count),
			Examples: []string{fmt.Sprintf("%s seqs %s: %s", f.Source, set.String(), f.Detail)}})
	}
	return out
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
