package soak

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/onceflow/onceflow/internal/reconcile"
)

// Report is what a soak run found.
type Report struct {
	// OK is true when no anomaly was found.
	OK bool `json:"ok"`
	// Command is how the run was started (set by the caller).
	Command          string    `json:"command,omitempty"`
	Seed             uint64    `json:"seed"`
	Rate             int       `json:"rate"`
	DurationS        float64   `json:"duration_s"`
	FaultIntervalS   float64   `json:"fault_interval_s"`
	StartedAt        time.Time `json:"started_at"`
	ProducingSeconds float64   `json:"producing_s"`
	// LoadStart and LoadEnd are /proc/loadavg's three averages when
	// producing began and when the report was made.
	LoadStart    string  `json:"load_avg_start"`
	LoadEnd      string  `json:"load_avg_end"`
	DrainSeconds float64 `json:"drain_s"`

	Events EventCounts `json:"events"`

	Faults       []Fault          `json:"faults"`
	FaultsByKind map[string]int   `json:"faults_by_kind"`
	Restarts     int              `json:"broker_and_database_restarts"`
	Recovery     Stats            `json:"recovery"`
	RecoveryBy   map[string]Stats `json:"recovery_by_kind"`
	// ByFault is the per-fault-kind table: faults, the events near them
	// lost, duplicated or reordered, and recovery.
	ByFault []FaultKindRow `json:"by_fault_kind"`
	Stalls  int            `json:"stalls"`
	// Unavailable are the fault kinds this machine could not inject, and
	// why (e.g. broker-disk-full needs root to mount a tmpfs).
	Unavailable map[string]string `json:"unavailable_fault_kinds,omitempty"`
	Latency     Stats             `json:"probe_latency"`
	Anomalies   []Anomaly         `json:"anomalies"`
	// Reconcile sums what the reconcile check read and found for consumer
	// soak over both producing databases (nil when it could not run: then
	// it is an anomaly); Reconciles has each (database, consumer) run.
	Reconcile  *ReconcileSummary `json:"reconcile,omitempty"`
	Reconciles []ReconcileRun    `json:"reconciles,omitempty"`
	// Replica is what the replica check compared of database b's outbox
	// and its source's (nil when it could not run: then it is an anomaly).
	Replica *ReplicaCheck `json:"replica,omitempty"`
	// InDoubt counts, from the relays' logs, the Kafka commits that got no
	// answer and how their batches were settled.
	InDoubt InDoubtCounts  `json:"relay_in_doubt"`
	ByKind  map[string]int `json:"anomalies_by_kind"`

	UnexpectedExits   []string `json:"unexpected_exits"`
	ProducerErrors    int64    `json:"producer_errors"`
	LastProducerError string   `json:"last_producer_error,omitempty"`
	TopicPollErrors   int64    `json:"topic_poll_errors"`
	Notes             []string `json:"notes"`
	Series            []sample `json:"series"`
}

// ReconcileSummary is the reconcile check's part of the report: consumer
// soak's runs against both producing databases, folded by add.
type ReconcileSummary struct {
	Counts    reconcile.Counts `json:"counts"`
	Anomalies int              `json:"anomalies"`
	Seconds   float64          `json:"seconds"`
}

// ReconcileRun is one run of the reconcile check: one producing database
// against one consumer name.
type ReconcileRun struct {
	Database  string           `json:"database"`
	Consumer  string           `json:"consumer"`
	Counts    reconcile.Counts `json:"counts"`
	Anomalies int              `json:"anomalies"`
	Seconds   float64          `json:"seconds"`
}

// add folds in one database's run for the same consumer: the outbox rows
// are that database's own and add up; the records, the inbox rows and the
// streams are read whole by every run (the consumer applies every
// database's events), so the summary keeps the largest.
func (s *ReconcileSummary) add(r ReconcileRun) {
	c := &s.Counts
	c.Committed += r.Counts.Committed
	c.Queued += r.Counts.Queued
	c.Streams = max(c.Streams, r.Counts.Streams)
	c.Records = max(c.Records, r.Counts.Records)
	c.Malformed = max(c.Malformed, r.Counts.Malformed)
	c.Unconsumed = max(c.Unconsumed, r.Counts.Unconsumed)
	c.Applied = max(c.Applied, r.Counts.Applied)
	c.Parked = max(c.Parked, r.Counts.Parked)
	c.Dead = max(c.Dead, r.Counts.Dead)
	c.Ranges = max(c.Ranges, r.Counts.Ranges)
	s.Anomalies += r.Anomalies
	s.Seconds += r.Seconds
}

// EventCounts are the totals of the run.
type EventCounts struct {
	Committed             int64 `json:"committed"`
	RolledBack            int64 `json:"rolled_back"`
	ViaSQL                int64 `json:"via_sql_function"`
	Transactions          int64 `json:"transactions"`
	LongTransactions      int64 `json:"long_transactions"`
	UnknownCommitOutcomes int64 `json:"unknown_commit_outcomes"`
	Retries               int64 `json:"transaction_retries"`
	Sources               int   `json:"sources"`
	// Streams are the (database, topic, source) triples written.
	Streams int `json:"streams"`
	// ByDatabase is the committed events per producing database.
	ByDatabase map[string]int64 `json:"committed_by_database"`
	// AppliedBy is the applied events per consumer name (Applied is
	// consumer soak's).
	AppliedBy map[string]int64 `json:"applied_by_consumer"`
	// Snapshots are the REPEATABLE READ snapshots held to their end, for
	// SnapshotSeconds in all.
	Snapshots       int64   `json:"snapshots_held"`
	SnapshotSeconds float64 `json:"snapshot_seconds"`
	OnTopic         int64   `json:"on_topic"`
	OnTopicDistinct int64   `json:"on_topic_distinct"`
	Applied         int64   `json:"applied"`
	AppliedDistinct int64   `json:"applied_distinct"`
	Late            int64   `json:"late"`
}

// Stats summarise durations in seconds.
type Stats struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_s"`
	P99 float64 `json:"p99_s"`
	Max float64 `json:"max_s"`
}

func (s Stats) String() string {
	if s.N == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %.1fs  p99 %.1fs  max %.1fs  (n=%d)", s.P50, s.P99, s.Max, s.N)
}

func stats(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	return Stats{N: len(s), P50: q(0.50), P99: q(0.99), Max: s[len(s)-1]}
}

func durationStats(ds []time.Duration) Stats {
	xs := make([]float64, len(ds))
	for i, d := range ds {
		xs[i] = d.Seconds()
	}
	return stats(xs)
}

func (rep *Report) summarizeFaults() {
	rep.FaultsByKind = map[string]int{}
	rep.RecoveryBy = map[string]Stats{}
	by := map[string][]float64{}
	var all []float64
	for _, f := range rep.Faults {
		rep.FaultsByKind[f.Kind]++
		if f.Kind == KindBrokerKill || f.Kind == KindPGRestart || f.Kind == KindBrokerDiskFull || f.Kind == KindPGSwitchover {
			rep.Restarts++
		}
		if f.RecoveryS < 0 {
			rep.Stalls++
			continue
		}
		all = append(all, f.RecoveryS)
		by[f.Kind] = append(by[f.Kind], f.RecoveryS)
	}
	rep.Recovery = stats(all)
	for k, xs := range by {
		rep.RecoveryBy[k] = stats(xs)
	}
	rep.ByKind = map[string]int{}
	for _, a := range rep.Anomalies {
		rep.ByKind[a.Kind] += a.Count
	}
}

// Text is the human-readable report.
func (rep *Report) Text() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("onceflow soak report\n\n")
	if rep.Command != "" {
		p("command      %s\n", rep.Command)
	}
	p("seed         %d\n", rep.Seed)
	p("started      %s\n", rep.StartedAt.Format(time.RFC3339))
	p("producing    %s at %d events/s offered; drained in %s\n",
		secs(rep.ProducingSeconds), rep.Rate, secs(rep.DrainSeconds))
	if rep.LoadStart != "" {
		p("load avg     %s at the start, %s at the end (1, 5, 15 min)\n", rep.LoadStart, rep.LoadEnd)
	}
	e := rep.Events
	p("\nevents\n")
	p("  committed          %d in %d transactions (%d through onceflow.enqueue in SQL, the rest through outbox.Enqueue in Go)\n",
		e.Committed, e.Transactions, e.ViaSQL)
	p("  rolled back        %d events of rolled-back transactions (planned, or failed and retried)\n", e.RolledBack)
	p("  long transactions  %d committed (held open 2–20 s)\n", e.LongTransactions)
	p("  commit outcome looked up %d times; transactions retried %d times\n", e.UnknownCommitOutcomes, e.Retries)
	p("  published          %d records read with read_committed (%d distinct events)\n", e.OnTopic, e.OnTopicDistinct)
	p("  applied            %d side effects by consumer soak (%d distinct events, %d late)", e.Applied, e.AppliedDistinct, e.Late)
	for _, name := range consumerNames[1:] {
		p("; %d by %s", e.AppliedBy[name], name)
	}
	p("\n")
	p("  workload           databases a %d and b %d events, same source names; %d sources on %d streams (database, topic, source) over %d topics\n",
		e.ByDatabase[dbA], e.ByDatabase[dbB], e.Sources, e.Streams, len(eventTopics))
	p("  snapshots held     %d REPEATABLE READ snapshots held to their end, %s in all\n", e.Snapshots, secs(e.SnapshotSeconds))
	if er, ok := edgeRates(rep.Series); ok {
		p("  committed rate     %.0f events/s in the first %s, %.0f in the last (ratio %.2f)\n", er.first, secs(er.window), er.last, er.last/er.first)
	}

	p("\nfaults       %d in all, %d broker or database restarts\n", len(rep.Faults), rep.Restarts)
	if len(rep.ByFault) > 0 {
		// Each broken event counts on the fault that began nearest its
		// commit (60 s before to 30 s after it), else on "(no fault)".
		p("  %-28s %6s %6s %10s %9s   %s\n", "kind", "faults", "lost", "duplicated", "reordered", "recovery")
		for _, r := range rep.ByFault {
			n := fmt.Sprint(r.Faults)
			rec := r.Recovery.String()
			if r.Kind == NoFault {
				n, rec = "-", "-"
			}
			p("  %-28s %6s %6d %10d %9d   %s\n", r.Kind, n, r.Lost, r.Duplicated, r.Reordered, rec)
		}
	} else {
		for _, k := range AllKinds {
			if n := rep.FaultsByKind[k]; n > 0 {
				p("  %-28s %4d   recovery %s\n", k, n, rep.RecoveryBy[k])
			}
		}
	}
	for _, k := range AllKinds {
		if why, ok := rep.Unavailable[k]; ok {
			p("  %-28s not injected: %s\n", k, why)
		}
	}
	p("recovery     %s (fault to progress again on every partition)\n", rep.Recovery)
	if rep.Stalls > 0 {
		p("stalls       %d faults without progress within the recovery timeout\n", rep.Stalls)
	}
	p("latency      %s (probe commit to applied, whole run)\n", rep.Latency)

	for _, rc := range rep.Reconciles {
		c := rc.Counts
		p("reconcile    database %s, consumer %-10s %d outbox rows, %d records, %d applied on %d streams; %d anomalies (%s, at most %d seq ranges held)\n",
			rc.Database, rc.Consumer+":", c.Committed, c.Records, c.Applied, c.Streams, rc.Anomalies, secs(rc.Seconds), c.Ranges)
	}
	if c := rep.Replica; c != nil {
		p("replica      database %s's outbox against its source's: %d rows at the source, %d in %s (%s)\n",
			dbB, c.SourceRows, c.SubscriberRows, dbBName, secs(c.Seconds))
	}
	if d := rep.InDoubt; d.Unknown > 0 || d.Settled > 0 || d.Split > 0 {
		p("in doubt     %d relay commits got no answer; %d batches settled by their records, %d of them split by Kafka (committed in some partitions, aborted in others)\n",
			d.Unknown, d.Settled, d.Split)
	}
	p("\nanomalies    ")
	if len(rep.Anomalies) == 0 {
		p("none: nothing lost, duplicated, reordered or phantom; no gap given up\n")
	} else {
		p("%d kinds\n", len(rep.Anomalies))
		for _, a := range rep.Anomalies {
			p("  %s on %s: %d\n", a.Kind, a.Where, a.Count)
			for _, x := range a.Examples {
				p("      e.g. %s\n", x)
			}
		}
	}
	if len(rep.UnexpectedExits) > 0 {
		p("\nprocesses that exited by themselves (restarted): %d\n", len(rep.UnexpectedExits))
		for _, x := range first(rep.UnexpectedExits, 10) {
			p("  %s\n", x)
		}
	}
	if rep.ProducerErrors > 0 {
		p("\nproducer errors (retried) %d, last: %s\n", rep.ProducerErrors, rep.LastProducerError)
	}
	for _, n := range rep.Notes {
		p("note: %s\n", n)
	}
	p("\nfault log\n")
	for _, f := range rep.Faults {
		rec := fmt.Sprintf("%.1fs", f.RecoveryS)
		if f.RecoveryS < 0 {
			rec = "no progress within the timeout"
		}
		p("  %4d %7.1fs %-28s %-60s outage %5.1fs  recovery %s", f.N, f.AtS, f.Kind, f.Target, f.OutageS, rec)
		if f.Error != "" {
			p("  (%s)", f.Error)
		}
		p("\n")
	}
	if rep.OK {
		p("\nOK: zero anomalies.\n")
	} else {
		p("\nFAILED: %d anomalies.\n", len(rep.Anomalies))
	}
	return b.String()
}

func secs(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}

// writeReport writes report.txt, report.json and lag.png (throughput and
// lag, plotRun) into OutDir.
func (r *run) writeReport(rep *Report) error {
	if err := os.WriteFile(filepath.Join(r.cfg.OutDir, "report.txt"), []byte(rep.Text()), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.cfg.OutDir, "report.json"), js, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(r.cfg.OutDir, "lag.png"))
	if err != nil {
		return err
	}
	if err := plotRun(f, rep.Series, rep.Faults); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// InDoubtCounts are the relays' log lines about commits without an answer.
type InDoubtCounts struct {
	Unknown int `json:"unknown_outcomes"`
	Settled int `json:"settled_by_records"`
	Split   int `json:"split"`
}

// countInDoubt reads the relays' logs in dir (relay-*.log).
func countInDoubt(dir string) (InDoubtCounts, error) {
	var c InDoubtCounts
	files, err := filepath.Glob(filepath.Join(dir, "relay-*.log"))
	if err != nil {
		return c, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return c, err
		}
		c.Unknown += bytes.Count(b, []byte(`"msg":"publish batch: commit outcome unknown`))
		c.Settled += bytes.Count(b, []byte(`"msg":"batch in doubt settled by its records"`))
		c.Split += bytes.Count(b, []byte(`"msg":"Kafka ended one transaction differently in different partitions`))
	}
	return c, nil
}

// edgeWindow is the window edgeRates compares: the first and the last 5
// minutes of the load (a quarter of a load shorter than 20 minutes).
const edgeWindow = 300.0

// edgeRate is the committed rate at the two ends of the load.
type edgeRate struct{ first, last, window float64 }

// edgeRates compares the committed rate of the first and the last window
// of the load: cost that grows with the run's age, a held snapshot's for
// one, shows as a last window slower than the first. The load runs from
// the first readable sample to the first that holds the final count (the
// producers' end; the run's producing phase also waits for the last
// fault's recovery). ok is false when the load is too short to compare or
// the first window committed nothing.
func edgeRates(samples []sample) (edgeRate, bool) {
	var read []sample
	for _, x := range samples {
		if x.Committed >= 0 {
			read = append(read, x)
		}
	}
	if len(read) < 2 {
		return edgeRate{}, false
	}
	end := len(read) - 1
	for end > 0 && read[end-1].Committed == read[end].Committed {
		end--
	}
	t0, t1 := read[0].T, read[end].T
	w := min(edgeWindow, (t1-t0)/4)
	if w < 5 {
		return edgeRate{}, false
	}
	// last is the index of the last sample at or before t.
	last := func(t float64) int {
		i := 0
		for j := 0; j <= end && read[j].T <= t; j++ {
			i = j
		}
		return i
	}
	rate := func(a, b int) (float64, bool) {
		if read[b].T-read[a].T < w/2 {
			return 0, false
		}
		return float64(read[b].Committed-read[a].Committed) / (read[b].T - read[a].T), true
	}
	first, ok1 := rate(0, last(t0+w))
	final, ok2 := rate(last(t1-w), end)
	if !ok1 || !ok2 || first <= 0 {
		return edgeRate{}, false
	}
	return edgeRate{first: first, last: final, window: w}, true
}
