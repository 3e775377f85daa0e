package itest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// gate is a handler that, for one event, signals that it holds the inbox
// transaction and waits to be released; it then applies the effect (or
// fails, when fail is set). Other events are applied directly.
type gate struct {
	eventID string
	entered chan struct{}
	release chan struct{}
	fail    atomic.Bool
	calls   atomic.Int32
	apply   inbox.BatchHandler
}

func newGate(t *testing.T, eventID string) *gate {
	return &gate{eventID: eventID, entered: make(chan struct{}), release: make(chan struct{}), apply: sqlHandler(t)}
}

func (g *gate) Handle(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
	if ev.EventID == g.eventID && g.calls.Add(1) == 1 {
		close(g.entered)
		<-g.release
		if g.fail.Load() {
			return errors.New("winner rolls back")
		}
	}
	return g.apply.HandleBatch(ctx, tx, []inbox.Event{ev})
}

// waitingOnLock counts backends of db blocked on a row lock.
func waitingOnLock(t testing.TB, db *testkit.DB) int {
	return count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`)
}

// TestConsumerReplayUnderConcurrency: two engines (different groups, one
// database, one consumer name) get the same event at the same time. The
// second engine's inbox insert waits on the first one's row lock (bounded by
// the first transaction); when the first commits, the second sees a
// duplicate. Variant: the first rolls back and the second applies it.
func TestConsumerReplayUnderConcurrency(t *testing.T) {
	t.Parallel()
	for _, winnerFails := range []bool{false, true} {
		name := "winner-commits"
		if winnerFails {
			name = "winner-rolls-back"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := consumerDB(t)
			topic := testkit.Topic(t, "race", 1, nil)
			ev := testEvent("order-7", 1)
			produce(t, testkit.Client(t), topic, ev)

			g := newGate(t, ev.EventID)
			g.fail.Store(winnerFails)
			first := startEngine(t, inbox.Config{Pool: db.Pool, Group: "first-" + topic, Topics: []string{topic}, Handler: g})
			select {
			case <-g.entered:
			case <-time.After(30 * time.Second):
				t.Fatal("first engine never reached the handler")
			}
			second := startEngine(t, inbox.Config{Pool: db.Pool, Group: "second-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t)})
			eventually(t, 30*time.Second, "the second engine blocked on the first one's inbox row", func() (bool, string) {
				n := waitingOnLock(t, db)
				return n == 1, fmtState("backends waiting on a lock: ", n)
			})
			if p, d := second.metric("onceflow_consumer_processed_total"), second.metric("onceflow_consumer_duplicates_total"); p+d != 0 {
				t.Fatalf("second engine finished (processed %v, duplicates %v) while the first held the row", p, d)
			}
			released := time.Now()
			close(g.release)

			// When the first rolls back, the blocked second insert usually
			// wins; but the first engine retries the event after a short
			// backoff, and on a loaded machine that retry can take the row
			// before the woken second insert does. Either is correct: one
			// engine processes, the other counts a duplicate.
			eventually(t, 30*time.Second, "one processed, one duplicate", func() (bool, string) {
				p1, p2 := first.metric("onceflow_consumer_processed_total"), second.metric("onceflow_consumer_processed_total")
				d1, d2 := first.metric("onceflow_consumer_duplicates_total"), second.metric("onceflow_consumer_duplicates_total")
				return p1+p2 == 1 && d1+d2 == 1, fmtState("processed ", p1, "+", p2, ", duplicates ", d1, "+", d2)
			})
			winner, loser := first, second
			if second.metric("onceflow_consumer_processed_total") == 1 {
				winner, loser = second, first
			}
			if !winnerFails && winner != first {
				t.Fatal("the second engine processed the event although the first committed it")
			}
			// The wait ended with the first transaction: well under the
			// retry and poll intervals that would show up otherwise.
			if waited := time.Since(released); waited > 10*time.Second {
				t.Fatalf("the blocked engine needed %s after the first transaction ended", waited)
			}
			first.stop(t)
			second.stop(t)
			if p := loser.metric("onceflow_consumer_processed_total"); p != 0 {
				t.Fatalf("loser processed %v events, want 0", p)
			}
			if winnerFails {
				if he := first.metric("onceflow_consumer_handler_errors_total"); he != 1 {
					t.Fatalf("first engine handler errors %v, want 1", he)
				}
			}
			checkEffects(t, db, map[string]bool{ev.EventID: true})
			if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed'`); n != 1 {
				t.Fatalf("%d inbox rows, want 1", n)
			}
		})
	}
}
