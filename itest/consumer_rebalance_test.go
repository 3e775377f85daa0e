package itest

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// TestConsumerRebalanceStorm: for over 30 s under load, consumers of one
// group join and leave every one to three seconds (cooperative-sticky
// rebalances, revocation while batches are in flight). Nothing is lost and
// nothing is applied twice.
func TestConsumerRebalanceStorm(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	topic := testkit.Topic(t, "storm", 6, nil)
	cfg := inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t), BatchMaxRecords: 50}
	load := startLoad(t, topic, 10, 10*time.Millisecond)

	members := []*engine{startEngine(t, cfg)}
	all := append([]*engine{}, members...)
	joins, leaves := 1, 0
	end := time.Now().Add(32 * time.Second)
	for time.Now().Before(end) {
		// Members change at random moments: the point is to revoke
		// partitions while their batches are in flight.
		time.Sleep(time.Second + time.Duration(rand.IntN(2000))*time.Millisecond)
		if len(members) < 2 || (len(members) < 4 && rand.IntN(2) == 0) {
			members = append(members, startEngine(t, cfg))
			all = append(all, members[len(members)-1])
			joins++
		} else {
			i := rand.IntN(len(members))
			members[i].stop(t)
			members = append(members[:i], members[i+1:]...)
			leaves++
		}
	}
	want := load.finish()
	eventually(t, time.Minute, "every produced event applied", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM public.effects`)
		return n >= len(want), fmtState(n, " of ", len(want), " applied")
	})
	var dups float64
	for _, m := range members {
		m.stop(t)
	}
	for _, m := range all {
		dups += m.metric("onceflow_consumer_duplicates_total")
	}
	checkEffects(t, db, want)
	checkOrdered(t, db)
	var stale float64
	for _, m := range all {
		stale += m.metric("onceflow_consumer_stale_batches_dropped_total")
	}
	t.Logf("%d events, %d joins, %d leaves, %v duplicates seen, %v stale batches dropped, per-source order kept, 0 gaps given up, 0 late",
		len(want), joins, leaves, dups, stale)
}
