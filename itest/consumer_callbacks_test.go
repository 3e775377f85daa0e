package itest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// calls records what the Config callbacks were told, in order.
type calls struct {
	mu   sync.Mutex
	gaps []inbox.GapGivenUp
	dead []inbox.DeadLettered
	late []inbox.LateEvent
}

func (c *calls) install(cfg *inbox.Config) {
	cfg.OnGapGivenUp = func(_ context.Context, g inbox.GapGivenUp) { c.mu.Lock(); c.gaps = append(c.gaps, g); c.mu.Unlock() }
	cfg.OnDeadLetter = func(_ context.Context, d inbox.DeadLettered) { c.mu.Lock(); c.dead = append(c.dead, d); c.mu.Unlock() }
	cfg.OnLate = func(_ context.Context, l inbox.LateEvent) { c.mu.Lock(); c.late = append(c.late, l); c.mu.Unlock() }
}

func (c *calls) counts() (gaps, dead, late int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.gaps), len(c.dead), len(c.late)
}

func (c *calls) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("gaps %+v dead %+v late %+v", c.gaps, c.dead, c.late)
}

// failingHandler records the event ids the handler ran for (a late one
// suffixed "L"; a rolled-back run is recorded too) and fails the events in
// fail.
func failingHandler(fail ...string) (inbox.Handler, func() []string) {
	var mu sync.Mutex
	var applied []string
	bad := map[string]bool{}
	for _, id := range fail {
		bad[id] = true
	}
	h := inbox.HandlerFunc(func(_ context.Context, _ pgx.Tx, ev inbox.Event) error {
		if bad[ev.EventID] {
			return errors.New("poison: " + ev.EventID)
		}
		mu.Lock()
		defer mu.Unlock()
		id := ev.EventID
		if ev.Late {
			id += "L"
		}
		applied = append(applied, id)
		return nil
	})
	return h, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), applied...) }
}

func producedEvent(source string, seq int64) envelope.Envelope {
	ev := testEvent(source, seq)
	ev.Producer = "prod-1"
	return ev
}

// TestCallbacksGapGivenUpAndLate: a gap given up is told to OnGapGivenUp
// once, with its stream and range; the missing event arriving afterwards is
// told to OnLate (delivered marked late, or held).
func TestCallbacksGapGivenUpAndLate(t *testing.T) {
	t.Parallel()
	for _, policy := range []seqguard.Late{seqguard.DeliverLate, seqguard.Hold} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			db := consumerDB(t)
			topic := testkit.Topic(t, "cb-gap", 1, nil)
			cl := testkit.Client(t)
			h, applied := failingHandler()
			var got calls
			var logs logBuf
			cfg := inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, Handler: h, Logger: logs.logger(),
				LatePolicy: policy, GapTimeout: time.Second, GapCheckInterval: 50 * time.Millisecond}
			got.install(&cfg)
			startEngine(t, cfg)
			produce(t, cl, topic, producedEvent("src-a", 1), producedEvent("src-a", 2), producedEvent("src-a", 5))
			eventually(t, 30*time.Second, "the gap 3–4 given up and 5 applied", func() (bool, string) {
				g, _, _ := got.counts()
				a := applied()
				return g == 1 && len(a) > 0 && a[len(a)-1] == "src-a-5", fmt.Sprint("applied ", a, " ", got.String())
			})
			want := seqguard.Stream{Producer: "prod-1", Topic: topic, Source: "src-a"}
			g := got.gaps[0]
			if g.Stream != want || g.From != 3 || g.To != 4 || g.Reason != seqguard.ReasonTimeout || g.Deadline.Before(g.OpenedAt.Add(time.Second)) {
				t.Fatalf("OnGapGivenUp told %+v, want stream %+v range 3-4 reason timeout", g, want)
			}
			produce(t, cl, topic, producedEvent("src-a", 3))
			eventually(t, 30*time.Second, "seq 3 told to OnLate", func() (bool, string) {
				_, _, l := got.counts()
				return l == 1, got.String()
			})
			l := got.late[0]
			if l.EventID != "src-a-3" || l.Stream != want || l.Seq != 3 || l.Held != (policy == seqguard.Hold) {
				t.Fatalf("OnLate told %+v, want src-a-3 of %+v held=%v", l, want, policy == seqguard.Hold)
			}
			// A late event gets a WARN line, callback or not.
			if n := len(logs.lines(`"level":"WARN"`, "late event", `"event_id":"src-a-3"`)); n != 1 {
				t.Fatalf("%d late-event WARN lines for src-a-3, want 1", n)
			}
			// Settle: a later event in order is applied and nothing else is told.
			produce(t, cl, topic, producedEvent("src-a", 6))
			eventually(t, 30*time.Second, "seq 6 applied", func() (bool, string) {
				a := applied()
				return len(a) > 0 && a[len(a)-1] == "src-a-6", fmt.Sprint(a)
			})
			if g, d, l := got.counts(); g != 1 || d != 0 || l != 1 {
				t.Fatalf("callbacks: %s, want one gap and one late event", got.String())
			}
		})
	}
}

// TestCallbacksDeadLetter: a malformed record and a poison event in one
// batch are each told to OnDeadLetter once, although the batch's first
// transaction (which had dead-lettered the malformed record) rolled back
// when the poison event failed. A panicking callback does not stop the
// consumer.
func TestCallbacksDeadLetter(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	topic := testkit.Topic(t, "cb-dead", 1, nil)
	cl := testkit.Client(t)
	h, applied := failingHandler("poison-1")
	var got calls
	cfg := inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, Handler: h, RetryMaxAttempts: 3}
	got.install(&cfg)
	record := cfg.OnDeadLetter
	cfg.OnDeadLetter = func(ctx context.Context, d inbox.DeadLettered) {
		record(ctx, d)
		panic("a broken callback")
	}
	startEngine(t, cfg)
	bad := producedEvent("order-4", 1)
	badRec := bad.Record(topic)
	badRec.Value = []byte("{not json")
	good, poison := producedEvent("order-3", 1), producedEvent("poison", 1)
	produceRecords(t, cl, good.Record(topic), badRec, poison.Record(topic))
	eventually(t, 30*time.Second, "two dead letters told", func() (bool, string) {
		_, d, _ := got.counts()
		return d == 2, got.String()
	})
	produce(t, cl, topic, producedEvent("order-3", 2))
	eventually(t, 30*time.Second, "the consumer goes on after the panics", func() (bool, string) {
		a := applied()
		return len(a) > 0 && a[len(a)-1] == "order-3-2", fmt.Sprint(a)
	})
	if g, d, l := got.counts(); g != 0 || d != 2 || l != 0 {
		t.Fatalf("callbacks: %s, want two dead letters", got.String())
	}
	m, p := got.dead[0], got.dead[1]
	if !m.Malformed || m.Offset != 1 || m.Topic != topic || !strings.Contains(m.Reason, "JSON") {
		t.Fatalf("malformed dead letter told as %+v", m)
	}
	want := seqguard.Stream{Producer: "prod-1", Topic: topic, Source: "poison"}
	if p.Malformed || p.EventID != "poison-1" || p.Stream != want || p.Seq != 1 || p.Offset != 2 || !strings.Contains(p.Reason, "poison: poison-1") {
		t.Fatalf("poison dead letter told as %+v", p)
	}
}

// TestCallbacksRolledBackGiveUpToldOnce: the gap timer gives up a gap and
// the released event behind it fails, so the give-up rolls back, tick after
// tick, until the event is dead-lettered in place. The rolled-back attempts
// are told nothing: one gap given up, one dead letter.
func TestCallbacksRolledBackGiveUpToldOnce(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	topic := testkit.Topic(t, "cb-rollback", 1, nil)
	cl := testkit.Client(t)
	h, applied := failingHandler("src-r-3")
	var got calls
	var logs logBuf
	cfg := inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, Handler: h, Logger: logs.logger(),
		RetryMaxAttempts: 3, GapTimeout: 500 * time.Millisecond, GapCheckInterval: 50 * time.Millisecond}
	got.install(&cfg)
	startEngine(t, cfg)
	produce(t, cl, topic, producedEvent("src-r", 1), producedEvent("src-r", 3), producedEvent("src-r", 4))
	eventually(t, 30*time.Second, "seq 3 dead-lettered, 4 applied", func() (bool, string) {
		_, d, _ := got.counts()
		a := applied()
		return d == 1 && len(a) > 0 && a[len(a)-1] == "src-r-4", fmt.Sprint("applied ", a, " ", got.String())
	})
	if n := len(logs.lines("gap timer: handler failed on a released parked event")); n < 2 {
		t.Fatalf("%d rolled-back give-ups logged, want at least 2 (the test needs them)", n)
	}
	if g, d, l := got.counts(); g != 1 || d != 1 || l != 0 {
		t.Fatalf("callbacks: %s, want one gap given up and one dead letter", got.String())
	}
	want := seqguard.Stream{Producer: "prod-1", Topic: topic, Source: "src-r"}
	if g := got.gaps[0]; g.Stream != want || g.From != 2 || g.To != 2 {
		t.Fatalf("OnGapGivenUp told %+v", g)
	}
	if d := got.dead[0]; d.EventID != "src-r-3" || d.Stream != want || d.Seq != 3 || d.Malformed {
		t.Fatalf("OnDeadLetter told %+v", d)
	}
	// The give-up's ERROR line says how many released events were
	// dead-lettered rather than claiming them applied.
	if given := logs.lines("sequence gap given up", `"dead_lettered":1`); len(given) != 1 {
		t.Fatalf("%d given-up lines counting 1 dead-lettered event, want 1:\n%s", len(given), strings.Join(logs.lines("sequence gap given up"), "\n"))
	}
}
