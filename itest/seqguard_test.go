package itest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// TestSeqGuardParksUntilGapFills: seq 5 before 4 (default ordering, the
// sequence guard) → 5 is parked (inbox status parked, gauges and totals
// say so), then 4 arrives and 4 and 5 are applied in order. The gap is
// filled, never given up; no ERROR line.
func TestSeqGuardParksUntilGapFills(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := seqDB(t)
	topic := testkit.Topic(t, "seq-park", 1, nil)
	cl := testkit.Client(t)
	var logs logBuf
	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic},
		BatchHandler: seqHandler(t), Logger: logs.logger(), GapTimeout: time.Minute, GapCheckInterval: 50 * time.Millisecond})
	produce(t, cl, topic, testEvent("s", 1), testEvent("s", 2), testEvent("s", 3), testEvent("s", 5))
	eventually(t, 30*time.Second, "seq 5 parked", func() (bool, string) {
		p, g, pe := e.metric("onceflow_consumer_parked_total"), e.metric("onceflow_consumer_seq_gaps_open"), e.metric("onceflow_consumer_parked_events")
		o := appliedOrder(t, db, "s")
		return p == 1 && g == 1 && pe == 1 && o == "1 2 3", fmtState("parked_total ", p, " gaps_open ", g, " parked_events ", pe, " applied ", o)
	})
	var status string
	if err := db.Pool.QueryRow(ctx, `SELECT status FROM onceflow.inbox WHERE event_id = 's-5'`).Scan(&status); err != nil || status != "parked" {
		t.Fatalf("s-5 status %q err %v, want parked", status, err)
	}
	produce(t, cl, topic, testEvent("s", 4))
	eventually(t, 30*time.Second, "4 and 5 applied in order", func() (bool, string) {
		o := appliedOrder(t, db, "s")
		g := e.metric("onceflow_consumer_seq_gaps_open")
		return o == "1 2 3 4 5" && g == 0, fmtState("applied ", o, " gaps_open ", g)
	})
	e.stop(t)
	for name, want := range map[string]float64{
		"onceflow_consumer_processed_total":         5,
		"onceflow_consumer_parked_total":            1,
		"onceflow_consumer_seq_gaps_opened_total":   1,
		"onceflow_consumer_seq_gaps_given_up_total": 0,
		"onceflow_consumer_late_events_total":       0,
		"onceflow_consumer_parked_events":           0,
	} {
		if got := e.metric(name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'filled' AND from_seq = 4 AND to_seq = 4`); n != 1 {
		t.Errorf("%d filled gaps 4-4, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state <> 'filled'`); n != 0 {
		t.Errorf("%d gaps not filled, want 0", n)
	}
	if l := logs.lines(`"level":"ERROR"`); len(l) != 0 {
		t.Errorf("ERROR lines: %v", l)
	}
}

// TestSeqGuardGivesUpMissingSeq: seq 7 is never sent (6, 8, 9, 10 are): after
// the 2s gap timeout the gap is given up exactly once (one seq_gaps row, the
// counter at 1, one ERROR line naming source and range) and 8–10 are
// applied in order after 6. Then 7 arrives: deliver-late hands it to the
// handler marked late; hold keeps it (inbox status held). Counted either way.
func TestSeqGuardGivesUpMissingSeq(t *testing.T) {
	t.Parallel()
	for _, late := range []seqguard.Late{seqguard.DeliverLate, seqguard.Hold} {
		t.Run(late.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := seqDB(t)
			topic := testkit.Topic(t, "seq-giveup", 1, nil)
			cl := testkit.Client(t)
			var logs logBuf
			const timeout = 2 * time.Second
			e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic},
				BatchHandler: seqHandler(t), Logger: logs.logger(), LatePolicy: late,
				GapTimeout: time.Hour, GapTimeouts: []inbox.GapTimeout{{Pattern: "test.*", Timeout: timeout}},
				GapCheckInterval: 50 * time.Millisecond})
			var evs []envelope.Envelope
			for _, seq := range []int64{1, 2, 3, 4, 5, 6, 8, 9, 10} {
				evs = append(evs, testEvent("src-a", seq))
			}
			produce(t, cl, topic, evs...)
			eventually(t, 30*time.Second, "1–6 applied, 8–10 parked", func() (bool, string) {
				o, pe := appliedOrder(t, db, "src-a"), e.metric("onceflow_consumer_parked_events")
				return o == seqRange(1, 6) && pe == 3, fmtState("applied ", o, " parked_events ", pe)
			})
			eventually(t, 30*time.Second, "the gap given up and 8–10 applied", func() (bool, string) {
				o, g := appliedOrder(t, db, "src-a"), e.metric("onceflow_consumer_seq_gaps_given_up_total")
				return g >= 1 && o == "1 2 3 4 5 6 8 9 10", fmtState("applied ", o, " given_up_total ", g)
			})
			var opened, closed time.Time
			var reason string
			if err := db.Pool.QueryRow(ctx, `SELECT opened_at, closed_at, give_up_reason FROM onceflow.seq_gaps
				WHERE source = 'src-a' AND from_seq = 7 AND to_seq = 7 AND state = 'given_up'`).Scan(&opened, &closed, &reason); err != nil {
				t.Fatalf("given-up gap row: %v", err)
			}
			if closed.Sub(opened) < timeout || reason != "timeout" {
				t.Fatalf("gap given up after %s (reason %q), want at least %s", closed.Sub(opened), reason, timeout)
			}
			lines := logs.lines(givenUpMsg, `"source":"src-a"`, `"range":"7-7"`, `"reason":"timeout"`, `"opened_at"`)
			if len(lines) != 1 {
				t.Fatalf("%d ERROR lines for the gap, want 1:\n%v", len(lines), logs.lines(`"level":"ERROR"`))
			}

			// Seq 7 arrives after its gap was given up.
			produce(t, cl, topic, testEvent("src-a", 7))
			var counter string
			if late == seqguard.DeliverLate {
				counter = "onceflow_consumer_late_events_total"
			} else {
				counter = "onceflow_consumer_held_total"
			}
			eventually(t, 30*time.Second, "the late policy applied to seq 7", func() (bool, string) {
				c, h := e.metric(counter), e.metric("onceflow_consumer_held_events")
				wantHeld := 0.0
				if late == seqguard.Hold {
					wantHeld = 1
				}
				return c == 1 && h == wantHeld, fmtState(counter, " ", c, " held_events ", h)
			})
			e.stop(t)
			var status string
			var lateFlag, kept bool
			if err := db.Pool.QueryRow(ctx, `SELECT status, late, payload IS NOT NULL FROM onceflow.inbox WHERE event_id = 'src-a-7'`).Scan(&status, &lateFlag, &kept); err != nil {
				t.Fatal(err)
			}
			o := appliedOrder(t, db, "src-a")
			switch late {
			case seqguard.DeliverLate:
				if o != "1 2 3 4 5 6 8 9 10 7L" || status != "processed" || !lateFlag {
					t.Fatalf("deliver-late: applied %q, inbox %s late=%v", o, status, lateFlag)
				}
			case seqguard.Hold:
				if o != "1 2 3 4 5 6 8 9 10" || status != "held" || !kept {
					t.Fatalf("hold: applied %q, inbox %s payload kept %v", o, status, kept)
				}
			}
			// Exactly one give-up, wherever one looks.
			if g := e.metric("onceflow_consumer_seq_gaps_given_up_total"); g != 1 {
				t.Fatalf("given_up_total %v, want 1", g)
			}
			if n := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`); n != 1 {
				t.Fatalf("%d given-up gaps, want 1", n)
			}
			if l := logs.lines(givenUpMsg); len(l) != 1 {
				t.Fatalf("%d give-up ERROR lines, want 1", len(l))
			}
			if p := e.metric("onceflow_consumer_parked_total"); p != 3 {
				t.Fatalf("parked_total %v, want 3", p)
			}
		})
	}
}

// TestSeqGuardTwoReplicasOneGiveUp: two engines (one group, one consumer
// name) both run the gap timer over the same database. Five sources each
// miss seq 2; every gap is given up exactly once: five given-up rows, and
// the two engines' counters sum to five.
func TestSeqGuardTwoReplicasOneGiveUp(t *testing.T) {
	t.Parallel()
	db := seqDB(t)
	topic := testkit.Topic(t, "seq-replicas", 2, nil)
	cl := testkit.Client(t)
	cfg := inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic},
		BatchHandler: seqHandler(t), GapTimeout: 2 * time.Second, GapCheckInterval: 20 * time.Millisecond}
	var la, lb logBuf
	ca, cb := cfg, cfg
	ca.Logger, cb.Logger = la.logger(), lb.logger()
	a, b := startEngine(t, ca), startEngine(t, cb)
	const sources = 5
	for i := range sources {
		src := fmt.Sprintf("rep-%d", i)
		produce(t, cl, topic, testEvent(src, 1), testEvent(src, 3), testEvent(src, 4))
	}
	eventually(t, 60*time.Second, "every gap given up and the parked events applied", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM public.applied`)
		g := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`)
		return n == 3*sources && g == sources, fmtState("applied ", n, " given-up rows ", g)
	})
	a.stop(t)
	b.stop(t)
	if g := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps`); g != sources {
		t.Fatalf("%d gap rows, want %d (one per source)", g, sources)
	}
	ga, gb := a.metric("onceflow_consumer_seq_gaps_given_up_total"), b.metric("onceflow_consumer_seq_gaps_given_up_total")
	if ga+gb != sources {
		t.Fatalf("given_up_total %v + %v, want %d in all", ga, gb, sources)
	}
	if n := len(la.lines(givenUpMsg)) + len(lb.lines(givenUpMsg)); n != sources {
		t.Fatalf("%d give-up ERROR lines, want %d", n, sources)
	}
	for i := range sources {
		src := fmt.Sprintf("rep-%d", i)
		if o := appliedOrder(t, db, src); o != "1 3 4" {
			t.Fatalf("%s applied %q", src, o)
		}
	}
	t.Logf("give-ups: replica a %v, replica b %v", ga, gb)
}

// TestSeqGuardSourceOnTwoPartitions: a source whose events arrive on two
// partitions (its key changed) is still applied in seq order. First 6–10
// land on partition 1 and are parked; then 1–5 on partition 0 release them.
// Then a second source alternates partitions for 200 events, so both
// partitions' workers park and release its events concurrently.
func TestSeqGuardSourceOnTwoPartitions(t *testing.T) {
	t.Parallel()
	db := seqDB(t)
	topic := testkit.Topic(t, "seq-moved", 2, nil)
	cl := testkit.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	on := func(part int32, src string, from, to int64) []*kgo.Record {
		var recs []*kgo.Record
		for seq := from; seq <= to; seq++ {
			ev := testEvent(src, seq)
			r := ev.Record(topic)
			r.Partition = part
			recs = append(recs, r)
		}
		return recs
	}
	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic},
		BatchHandler: seqHandler(t), GapTimeout: 5 * time.Minute, GapCheckInterval: 50 * time.Millisecond, BatchMaxRecords: 7})
	produceRecords(t, cl, on(1, "moved", 6, 10)...)
	eventually(t, 30*time.Second, "6–10 parked", func() (bool, string) {
		p := e.metric("onceflow_consumer_parked_total")
		return p == 5, fmtState("parked_total ", p)
	})
	produceRecords(t, cl, on(0, "moved", 1, 5)...)
	eventually(t, 30*time.Second, "1–10 applied", func() (bool, string) {
		o := appliedOrder(t, db, "moved")
		return o == seqRange(1, 10), fmtState("applied ", o)
	})

	// Alternating partitions, produced concurrently per partition.
	const n = 200
	var even, odd []*kgo.Record
	for seq := int64(1); seq <= n; seq++ {
		if seq%2 == 0 {
			even = append(even, on(0, "flip", seq, seq)...)
		} else {
			odd = append(odd, on(1, "flip", seq, seq)...)
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); produceRecords(t, cl, even...) }()
	produceRecords(t, cl, odd...)
	<-done
	eventually(t, 60*time.Second, "1–200 applied", func() (bool, string) {
		c := count(t, db, `SELECT count(*) FROM public.applied WHERE source = 'flip'`)
		return c == n, fmtState("applied ", c)
	})
	e.stop(t)
	if o := appliedOrder(t, db, "flip"); o != seqRange(1, n) {
		t.Fatalf("flip applied out of order: %s", o)
	}
	if g := e.metric("onceflow_consumer_seq_gaps_given_up_total"); g != 0 {
		t.Fatalf("given_up_total %v, want 0", g)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status <> 'processed'`); n != 0 {
		t.Fatalf("%d inbox rows not processed", n)
	}
}
