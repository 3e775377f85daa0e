package itest

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// TestConsumerDoubleDelivery: the same event produced twice (in one batch,
// and again later in a batch of its own) gives one inbox row and one side
// effect; the other deliveries are counted as duplicates.
func TestConsumerDoubleDelivery(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	topic := testkit.Topic(t, "dd", 1, nil)
	cl := testkit.Client(t)
	a, b := testEvent("order-1", 1), testEvent("order-2", 1)
	produce(t, cl, topic, a, a, b)

	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t)})
	eventually(t, 30*time.Second, "both events applied", func() (bool, string) {
		p, d := e.metric("onceflow_consumer_processed_total"), e.metric("onceflow_consumer_duplicates_total")
		return p == 2 && d == 1, fmtState("processed", p, "duplicates", d)
	})
	// A redelivery in a later batch.
	produce(t, cl, topic, a)
	eventually(t, 30*time.Second, "the redelivery counted as a duplicate", func() (bool, string) {
		d := e.metric("onceflow_consumer_duplicates_total")
		return d == 2, fmtState("duplicates", d)
	})
	e.stop(t)
	if p := e.metric("onceflow_consumer_processed_total"); p != 2 {
		t.Fatalf("processed %v, want 2", p)
	}
	checkEffects(t, db, map[string]bool{a.EventID: true, b.EventID: true})
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed'`); n != 2 {
		t.Fatalf("%d inbox rows, want 2", n)
	}
	// The next offset is stored in Postgres with the events.
	if n := count(t, db, `SELECT next_offset FROM onceflow.consumer_offsets WHERE group_id = $1`, "g-"+topic); n != 4 {
		t.Fatalf("stored next offset %d, want 4", n)
	}
}
