package soak

import (
	"bytes"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// The schedule is a function of the seed, opens with the essential kinds
// and then covers every kind once.
func TestScheduler(t *testing.T) {
	t.Parallel()
	draw := func(seed uint64) []plan {
		s := newScheduler(seed, AllKinds, 4*time.Second)
		var ps []plan
		for range 200 {
			ps = append(ps, s.next())
		}
		return ps
	}
	a, b, c := draw(7), draw(7), draw(8)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed drew two schedules")
	}
	if reflect.DeepEqual(a, c) {
		t.Fatal("two seeds drew the same schedule")
	}
	var opening []string
	for _, p := range a[:len(AllKinds)] {
		opening = append(opening, p.kind)
	}
	for _, k := range essential {
		if i := slices.Index(opening, k); i < 0 || i >= len(essential) {
			t.Errorf("essential kind %s at %d of the opening %v", k, i, opening)
		}
	}
	for _, k := range AllKinds {
		if !slices.Contains(opening, k) {
			t.Errorf("kind %s missing from the opening %v", k, opening)
		}
	}
	restarts := 0
	for _, p := range a {
		if p.outage < 0 || p.gap < 2*time.Second || p.gap > 6*time.Second {
			t.Errorf("plan %+v: outage or gap out of range", p)
		}
		if p.kind == KindBrokerKill || p.kind == KindPGRestart {
			restarts++
			if p.kind == KindBrokerKill && !slices.Contains(brokerRoles, p.role) {
				t.Errorf("broker kill with role %q", p.role)
			}
		}
	}
	if restarts < 30 { // a quarter of 200, give or take
		t.Errorf("%d broker or database restarts in 200 faults", restarts)
	}
	only := newScheduler(1, []string{KindPGRestart}, time.Second)
	for range 10 {
		if k := only.next().kind; k != KindPGRestart {
			t.Fatalf("kind %s outside the enabled ones", k)
		}
	}
}

// world is a small run fed to findAnomalies: a ledger, the topic and the
// applied side effects, clean until a case breaks it.
type world struct {
	l     *ledger
	tw    *topicWatch
	aw    *appliedWatch
	inbox []inboxRow
	gaps  []gapRow
	off   map[int32]int64
	n     int64
}

func newWorld() *world {
	return &world{l: newLedger(), tw: newTopicTally(), aw: newAppliedWatch(), off: map[int32]int64{}}
}

func (w *world) commit(evs ...enqueued) { w.l.commit(evs, 0) }

func (w *world) publish(e enqueued) {
	w.off[0]++
	w.tw.addFrom(e.topic, audit.Record{Partition: 0, Offset: w.off[0], Env: envelope.Envelope{EventID: e.id, Source: e.source, Seq: e.seq, Producer: e.db}})
}

func (w *world) apply(e enqueued, late bool) {
	w.n++
	w.aw.add(appliedRow{n: w.n, id: e.id, source: e.source, seq: e.seq, late: late, producer: e.db, topic: e.topic})
}

func (w *world) kinds() []string {
	var out []string
	for _, a := range findAnomalies(w.l, w.tw, w.aw, w.inbox, w.gaps) {
		out = append(out, a.Kind+"@"+a.Where)
	}
	return out
}

// Each way a run can break is found, and a clean run is clean.
func TestFindAnomalies(t *testing.T) {
	t.Parallel()
	a1, a2, a3 := enqueued{id: "a1", source: "a", seq: 1}, enqueued{id: "a2", source: "a", seq: 2}, enqueued{id: "a3", source: "a", seq: 3}
	b1 := enqueued{id: "b1", source: "b", seq: 1}
	clean := func() *world {
		w := newWorld()
		w.commit(a1, a2)
		w.commit(b1)
		w.commit(a3)
		for _, e := range []enqueued{a1, a2, b1, a3} {
			w.publish(e)
			w.apply(e, false)
		}
		return w
	}
	cases := []struct {
		name  string
		build func() *world
		want  []string
	}{
		{"clean", clean, nil},
		{"lost by the relay", func() *world {
			w := clean()
			c1 := enqueued{id: "c1", source: "c", seq: 1}
			w.commit(c1)
			return w
		}, []string{"lost@topic", "lost@applied"}},
		{"lost by the consumer", func() *world {
			w := clean()
			c1 := enqueued{id: "c1", source: "c", seq: 1}
			w.commit(c1)
			w.publish(c1)
			return w
		}, []string{"lost@applied"}},
		{"duplicate on the topic", func() *world {
			w := clean()
			w.publish(a2)
			return w
		}, []string{"duplicate@topic"}},
		{"applied twice", func() *world {
			w := clean()
			w.apply(a2, false)
			return w
		}, []string{"duplicate@applied"}},
		{"reordered", func() *world {
			w := newWorld()
			w.commit(a1, a2)
			w.publish(a2)
			w.publish(a1)
			w.apply(a2, false)
			w.apply(a1, false)
			return w
		}, []string{"reordered@topic", "reordered@applied"}},
		{"rolled back, published anyway", func() *world {
			w := clean()
			x := enqueued{id: "x1", source: "x", seq: 1}
			w.l.rollback([]enqueued{x})
			w.publish(x)
			w.apply(x, false)
			return w
		}, []string{"phantom@topic", "phantom@applied"}},
		{"late", func() *world {
			w := newWorld()
			w.commit(a1)
			w.publish(a1)
			w.apply(a1, true)
			return w
		}, []string{"late@applied"}},
		{"gap given up though nothing was missing", func() *world {
			w := clean()
			w.gaps = []gapRow{{source: "a", state: "given_up", reason: "timeout", from: 2, to: 2}}
			return w
		}, []string{"gap-given-up@seq_gaps"}},
		{"gap still open", func() *world {
			w := clean()
			w.gaps = []gapRow{{source: "a", state: "open", from: 4, to: 4}}
			return w
		}, []string{"stuck@seq_gaps"}},
		{"dead-lettered and parked", func() *world {
			w := clean()
			w.inbox = []inboxRow{{id: "a2", source: "a", seq: 2, status: "dead", lastError: "boom"}, {id: "b1", source: "b", seq: 1, status: "parked"}}
			return w
		}, []string{"dead-lettered@inbox", "stuck@inbox"}},
		{"a hole in a source's seqs", func() *world {
			w := newWorld()
			e := enqueued{id: "h3", source: "h", seq: 3}
			w.commit(enqueued{id: "h1", source: "h", seq: 1}, e)
			for _, x := range []enqueued{{id: "h1", source: "h", seq: 1}, e} {
				w.publish(x)
				w.apply(x, false)
			}
			return w
		}, []string{"seq-hole@producer"}},
		{"partial commit", func() *world {
			w := clean()
			w.l.partial = append(w.l.partial, "1 of 2 rows")
			return w
		}, []string{"partial-commit@producer"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := c.build().kinds()
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("anomalies %v, want %v", got, c.want)
			}
		})
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	var xs []float64
	for i := 1; i <= 100; i++ {
		xs = append(xs, float64(i))
	}
	s := stats(xs)
	if s.N != 100 || s.P50 != 50 || s.P99 != 99 || s.Max != 100 {
		t.Fatalf("%+v", s)
	}
	if (stats(nil) != Stats{}) {
		t.Fatal("stats of nothing")
	}
}

// The report renders: a PNG that decodes, and text with the verdict.
func TestReportRenders(t *testing.T) {
	t.Parallel()
	var samples []sample
	for i := range 300 {
		samples = append(samples, sample{T: float64(i), RelayLag: int64(i % 50), ConsumerLag: int64((i * 7) % 90),
			Committed: int64(100 * i), Applied: int64(90 * i)})
	}
	samples[100].RelayLag, samples[100].ConsumerLag = -1, -1 // the database was away
	faults := []Fault{{N: 1, Kind: KindBrokerKill, AtS: 20, RecoveryS: 9}, {N: 2, Kind: KindPGRestart, AtS: 90, RecoveryS: -1}}
	var buf bytes.Buffer
	samples[100].Applied = -1
	if err := plotRun(&buf, samples, faults); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 800 || b.Dy() < 400 {
		t.Fatalf("image %v", b)
	}
	rep := &Report{Seed: 3, Faults: faults, Anomalies: []Anomaly{{Kind: AnomalyLost, Where: whereTopic, Count: 1, Examples: []string{"e1"}}}}
	rep.summarizeFaults()
	txt := rep.Text()
	for _, want := range []string{"seed         3", "broker-kill", "stalls       1", "lost on topic: 1", "e.g. e1", "FAILED"} {
		if !strings.Contains(txt, want) {
			t.Errorf("report lacks %q:\n%s", want, txt)
		}
	}
	if rep.Restarts != 2 || rep.ByKind[AnomalyLost] != 1 {
		t.Errorf("restarts %d, by kind %v", rep.Restarts, rep.ByKind)
	}
}

// TestByFault: a broken event counts on the fault that began nearest its
// commit (60 s before to 30 s after), each event once per column, and an
// event far from every fault on "(no fault)"; every kind that ran has a
// row, with its recovery.
func TestByFault(t *testing.T) {
	t.Parallel()
	start := time.Now().Add(-time.Hour)
	w := newWorld()
	at := func(e enqueued, s float64) {
		w.commit(e)
		w.l.mu.Lock()
		ref := w.l.committed[e.id]
		ref.at = start.Add(time.Duration(s * float64(time.Second)))
		w.l.committed[e.id] = ref
		w.l.mu.Unlock()
	}
	lostNearKill := enqueued{id: "l1", source: "a", seq: 1}  // committed at 95 s, the relay killed at 100 s
	dupNearBroker := enqueued{id: "d1", source: "b", seq: 1} // committed at 310 s, a broker killed at 300 s
	reordNowhere := enqueued{id: "r2", source: "c", seq: 2}  // committed at 1000 s, far from both
	reordNowhereFirst := enqueued{id: "r1", source: "c", seq: 1}
	at(lostNearKill, 95)
	at(dupNearBroker, 310)
	at(reordNowhereFirst, 999)
	at(reordNowhere, 1000)
	w.publish(dupNearBroker)
	w.publish(dupNearBroker) // twice on the topic
	w.publish(reordNowhere)
	w.publish(reordNowhereFirst) // 2 before 1
	for _, e := range []enqueued{dupNearBroker, dupNearBroker, reordNowhereFirst, reordNowhere} {
		w.apply(e, false) // applied twice, in order
	}
	faults := []Fault{{Kind: KindBrokerKill, AtS: 300, RecoveryS: 12}, {Kind: KindRelayKill, AtS: 100, RecoveryS: 3},
		{Kind: KindRelayKill, AtS: 2000, RecoveryS: -1}}
	got := map[string]FaultKindRow{}
	var order []string
	for _, r := range byFault(w.l, w.tw, w.aw, faults, start) {
		got[r.Kind] = r
		order = append(order, r.Kind)
	}
	if order[len(order)-1] != NoFault || len(order) != 3 {
		t.Fatalf("rows %v: want the two kinds that ran, then %q", order, NoFault)
	}
	want := map[string]FaultKindRow{
		KindRelayKill:  {Kind: KindRelayKill, Faults: 2, Lost: 1, Recovery: Stats{N: 1, P50: 3, P99: 3, Max: 3}},
		KindBrokerKill: {Kind: KindBrokerKill, Faults: 1, Duplicated: 1, Recovery: Stats{N: 1, P50: 12, P99: 12, Max: 12}},
		NoFault:        {Kind: NoFault, Reordered: 1},
	}
	for k, wr := range want {
		if got[k] != wr {
			t.Errorf("%s: %+v, want %+v", k, got[k], wr)
		}
	}
}

// Streams are judged apart (I5): two databases writing one source name to
// one topic, and one source writing to two topics, each with its own seqs
// from 1, interleaved on the topics and in application, are clean; disorder
// inside one stream is still found.
func TestFindAnomaliesStreams(t *testing.T) {
	t.Parallel()
	ev := func(db, topic string, seq int64) enqueued {
		return enqueued{id: fmt.Sprintf("%s-%s-%d", db, topic, seq), source: "s", seq: seq, db: db, topic: topic}
	}
	a1, a2, b1, b2, c1 := ev(dbA, eventTopic, 1), ev(dbA, eventTopic, 2), ev(dbB, eventTopic, 1), ev(dbB, eventTopic, 2), ev(dbA, eventTopic2, 1)
	w := newWorld()
	w.commit(a1, b1)
	w.commit(c1, a2)
	w.commit(b2)
	order := []enqueued{a1, b1, c1, a2, b2}
	for _, e := range order {
		w.publish(e)
		w.apply(e, false)
	}
	if k := w.kinds(); len(k) != 0 {
		t.Fatalf("a clean run of three streams sharing a source name: %v", k)
	}
	gaps := []gapRow{{stream: streamKey(dbB, eventTopic, "s"), source: "s", from: 2, to: 2, state: "given_up", reason: "timeout"}}
	w.gaps = gaps
	if k := w.kinds(); !slices.Equal(k, []string{AnomalyGapGivenUp + "@" + whereSeqGaps}) {
		t.Fatalf("a gap given up on a committed seq of database b's stream: %v", k)
	}

	w = newWorld()
	w.commit(a1, b1)
	w.commit(a2, b2)
	for _, e := range []enqueued{a2, b1, a1, b2} {
		w.publish(e)
		w.apply(e, false)
	}
	if k := w.kinds(); !slices.Equal(k, []string{AnomalyReordered + "@" + whereTopic, AnomalyReordered + "@" + whereApplied}) {
		t.Fatalf("database a's seq 2 before its seq 1: %v", k)
	}
}

// soak-tally's counters must match the ledger per stream.
func TestTallyAnomalies(t *testing.T) {
	t.Parallel()
	l := newLedger()
	l.commit([]enqueued{
		{id: "1", source: "s", seq: 1, db: dbA, topic: eventTopic},
		{id: "2", source: "s", seq: 1, db: dbB, topic: eventTopic},
		{id: "3", source: "s", seq: 2, db: dbA, topic: eventTopic},
	}, 0)
	a, b := streamKey(dbA, eventTopic, "s"), streamKey(dbB, eventTopic, "s")
	if got := tallyAnomalies(l, []tallyRow{{a, 2, 2}, {b, 1, 1}}); got != nil {
		t.Fatalf("matching counters: %v", got)
	}
	for name, rows := range map[string][]tallyRow{
		"counted twice":  {{a, 3, 2}, {b, 1, 1}},
		"stream missing": {{a, 2, 2}},
		"seq short":      {{a, 2, 1}, {b, 1, 1}},
	} {
		got := tallyAnomalies(l, rows)
		if len(got) != 1 || got[0].Kind != AnomalyTally || got[0].Count != 1 {
			t.Errorf("%s: %+v, want one %s", name, got, AnomalyTally)
		}
	}
}

// rates: events per second over the last throughputWindow seconds, a hole
// where the counter could not be read.
func TestRates(t *testing.T) {
	t.Parallel()
	var samples []sample
	for i := range 20 {
		samples = append(samples, sample{T: float64(i), Committed: int64(50 * i)})
	}
	samples[10].Committed = -1
	got := rates(samples, func(s sample) int64 { return s.Committed })
	if len(got) != len(samples) || got[0].v != -1 || got[10].v != -1 {
		t.Fatalf("rates %v: want a hole at the first sample and at the unread one", got)
	}
	for i, p := range got {
		if i != 0 && i != 10 && p.v != 50 {
			t.Errorf("rate at %v s = %v, want 50", p.t, p.v)
		}
	}
}

// OutageScale shortens every outage (the test's short run) and the new
// broker kinds draw their targets like a broker kill.
func TestSchedulerOutageScale(t *testing.T) {
	t.Parallel()
	full, short, long := newScheduler(7, AllKinds, time.Second), newScheduler(7, AllKinds, time.Second), newScheduler(7, AllKinds, time.Second)
	short.outageScale = 0.2
	long.outageScale = 0.6
	evicting := 0
	for range 300 {
		a, b, c := full.next(), short.next(), long.next()
		if a.kind != b.kind || b.outage != time.Duration(float64(a.outage)*0.2) {
			t.Fatalf("plan %+v scaled to %+v", a, b)
		}
		// At 0.6 the evicting consumer pause still outlasts the session
		// timeout; every other outage scales.
		want := time.Duration(float64(a.outage) * 0.6)
		if a.evicting {
			evicting++
			want = consumerSessionTimeout + time.Duration(float64(a.outage-consumerSessionTimeout)*0.6)
			if want <= consumerSessionTimeout {
				t.Errorf("evicting pause %+v scaled to %v, within the session timeout", a, want)
			}
		}
		if c.kind != a.kind || c.outage != want {
			t.Fatalf("plan %+v scaled by 0.6 to %+v, want outage %v", a, c, want)
		}
		switch a.kind {
		case KindBrokerPartition:
			if !slices.Contains(brokerRoles, a.role) || a.outage < 2*time.Second || a.outage > 15*time.Second {
				t.Errorf("partition %+v", a)
			}
		case KindBrokerDiskFull:
			if a.outage < 2*time.Second || a.outage > 8*time.Second {
				t.Errorf("disk full %+v", a)
			}
		}
	}
	if evicting == 0 {
		t.Error("no evicting consumer pause in 300 plans")
	}
}

// TestCompareReplica: the replica check finds a row the subscriber lacks, a
// row it holds otherwise and a row the source never had, and nothing else.
func TestCompareReplica(t *testing.T) {
	row := func(id string, seq int64) outboxRow {
		return outboxRow{eventID: id, topic: eventTopic, source: "s", seq: seq}
	}
	src := map[int64]outboxRow{1: row("e1", 1), 2: row("e2", 2), 3: row("e3", 3), 4: row("e4", 4)}
	sub := map[int64]outboxRow{1: row("e1", 1), 3: row("e3", 4), 4: row("e4", 4), 9: row("e9", 5)}
	got := map[string]int{}
	for _, a := range compareReplica(src, sub, "replica") {
		got[a.Kind] += a.Count
	}
	want := map[string]int{"replica:missing": 1, "replica:differs": 1, "replica:phantom": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("found %v, want %v", got, want)
	}
	if a := compareReplica(src, src, "replica"); len(a) != 0 {
		t.Fatalf("identical outboxes: %v", a)
	}
}

// countInDoubt counts the relays' lines about commits without an answer,
// in every relay's log and no other.
func TestCountInDoubt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("relay-a.log", `{"level":"ERROR","msg":"publish batch: commit outcome unknown, recovering from checkpoint"}
{"level":"INFO","msg":"batch in doubt settled by its records","outcome":"3 rows committed, 0 aborted, checkpoint aborted"}
{"level":"ERROR","msg":"Kafka ended one transaction differently in different partitions: each row goes by its own record"}
`)
	write("relay-2a.log", `{"level":"ERROR","msg":"publish batch: commit outcome unknown, recovering from checkpoint"}
{"level":"INFO","msg":"batch in doubt settled by its records","outcome":"0 rows committed, 5 aborted, checkpoint aborted"}
`)
	write("consumer-a.log", `{"level":"ERROR","msg":"publish batch: commit outcome unknown, recovering from checkpoint"}
`)
	got, err := countInDoubt(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := (InDoubtCounts{Unknown: 2, Settled: 2, Split: 1}); got != want {
		t.Fatalf("counted %+v, want %+v", got, want)
	}
}

// The committed rate of the first and the last window of the load: 100/s
// for 700 s, then 60/s for 700 s, then nothing (the producers stopped; the
// run waits for its last fault), sampled from t = 1 s; a sample the
// sampler could not read is skipped.
func TestEdgeRates(t *testing.T) {
	t.Parallel()
	var samples []sample
	var n int64
	for i := 1; i <= 1700; i++ {
		samples = append(samples, sample{T: float64(i), Committed: n})
		switch {
		case i < 700:
			n += 100
		case i < 1400:
			n += 60
		}
	}
	samples[1000].Committed = -1
	er, ok := edgeRates(samples)
	if !ok || er.window != 300 || er.first != 100 || er.last != 60 {
		t.Fatalf("edgeRates = %+v, %v; want first 100, last 60 over 300 s", er, ok)
	}
	if er, ok := edgeRates(samples[:3]); ok {
		t.Errorf("a 3-second load has no windows to compare, got %+v", er)
	}
	short, ok := edgeRates(samples[:121])
	if !ok || short.window != 30 || short.first != 100 || short.last != 100 {
		t.Errorf("a 2-minute load compares quarters: got %+v, %v", short, ok)
	}
}
