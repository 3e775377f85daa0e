package itest

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// TestSeqGuardClockSkew: two replicas of one logical consumer, one clock 5
// minutes behind (it owns the partition and opens the gap), one 5 minutes
// ahead (its gap timer races to give the gap up). Gap deadlines and give-ups
// are on the database's clock: the gap is opened at the database's time,
// given up no earlier than its 3 s timeout after that and within a few
// seconds of it — neither early (the fast clock) nor 5 minutes late (the
// slow one).
func TestSeqGuardClockSkew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := seqDB(t)
	topic := testkit.Topic(t, "seq-skew", 1, nil)
	idle := testkit.Topic(t, "seq-skew-idle", 1, nil)
	const timeout = 3 * time.Second
	skewed := func(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }
	base := inbox.Config{Pool: db.Pool, ConsumerName: "skew", BatchHandler: seqHandler(t), GapTimeout: timeout, GapCheckInterval: 50 * time.Millisecond}
	slow, fast := base, base
	slow.Group, slow.Topics, slow.Clock = "g-"+topic, []string{topic}, skewed(-5*time.Minute)
	fast.Group, fast.Topics, fast.Clock = "g-"+idle, []string{idle}, skewed(5*time.Minute) // no events: only its gap timer works
	eSlow, eFast := startEngine(t, slow), startEngine(t, fast)
	eventually(t, 30*time.Second, "the fast replica running", func() (bool, string) {
		return eFast.c.Ready() == nil, "not ready"
	})
	produce(t, testkit.Client(t), topic, testEvent("s", 1), testEvent("s", 2), testEvent("s", 4))

	type gapRow struct {
		state                     string
		openedAt, deadline, dbNow time.Time
		closedAt                  *time.Time
	}
	read := func() (gapRow, bool) {
		var g gapRow
		err := db.Pool.QueryRow(ctx, `SELECT state, opened_at, deadline, closed_at, clock_timestamp() FROM onceflow.seq_gaps WHERE consumer = 'skew' AND source = 's'`).
			Scan(&g.state, &g.openedAt, &g.deadline, &g.closedAt, &g.dbNow)
		return g, err == nil
	}
	var open gapRow
	eventually(t, 30*time.Second, "the gap 3-3 open or given up", func() (bool, string) {
		g, ok := read()
		open = g
		return ok, "no gap row yet"
	})
	if d := open.dbNow.Sub(open.openedAt); d < 0 || d > 5*time.Second {
		t.Fatalf("gap opened at %s, the database's clock says %s: off by %s (a replica's clock was used)", open.openedAt, open.dbNow, d)
	}
	if d := open.deadline.Sub(open.openedAt); d != timeout {
		t.Fatalf("deadline %s after opened_at, want %s", d, timeout)
	}
	var done gapRow
	eventually(t, 30*time.Second, "the gap given up", func() (bool, string) {
		g, ok := read()
		if ok && g.state == "open" && !g.dbNow.Before(g.deadline.Add(timeout)) {
			t.Fatalf("the gap is still open %s after its deadline (database clock): given up late", g.dbNow.Sub(g.deadline))
		}
		done = g
		return ok && g.state == "given_up", "state " + g.state
	})
	if done.closedAt == nil || done.closedAt.Before(done.deadline) {
		t.Fatalf("given up at %v, before its deadline %s", done.closedAt, done.deadline)
	}
	if late := done.closedAt.Sub(done.deadline); late > timeout {
		t.Fatalf("given up %s after its deadline", late)
	}
	eventually(t, 30*time.Second, "1 2 4 applied", func() (bool, string) {
		o := appliedOrder(t, db, "s")
		return o == "1 2 4", "applied " + o
	})
	eSlow.stop(t)
	eFast.stop(t)
	if n := eSlow.metric("onceflow_consumer_seq_gaps_given_up_total") + eFast.metric("onceflow_consumer_seq_gaps_given_up_total"); n != 1 {
		t.Fatalf("%v gaps given up, want 1", n)
	}
	t.Logf("gap opened at %s (database clock), deadline +%s, given up +%s after the deadline", open.openedAt.Format(time.RFC3339Nano),
		open.deadline.Sub(open.openedAt), done.closedAt.Sub(done.deadline))
}
