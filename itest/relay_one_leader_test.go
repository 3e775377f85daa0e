package itest

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
)

var reOtherName = regexp.MustCompile(`"msg":"standing by: a relay with another -shard name leads this database`)

// TestRelayOneLeaderWhateverTheShardName: two relays of one database with
// -shards 1 but different -shard names (a name taken from the pod name, two
// manifests merged) start together. Only one may publish: the other stands
// by, logging the conflict at ERROR and setting
// onceflow_relay_layout_conflict. When the leader is SIGKILLed, the other
// settles its lease (fencing its transactional.id and marking what its last
// checkpoint names) and publishes the rest. 2,000 events must end as exactly
// 2,000 records on the topic, read with read_committed, in seq order per
// source.
func TestRelayOneLeaderWhateverTheShardName(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 3)
	enqueue := func(from, n int) {
		t.Helper()
		if _, err := e.db.Pool.Exec(ctx, `SELECT onceflow.enqueue($1, 'src-' || (i % 20), 'test.event', '{}'::jsonb, 'ev-' || i)
			FROM generate_series($2::int, $2::int + $3::int - 1) AS i`, e.topic, from, n); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(0, 1000)
	args := func(shard string) []string {
		return []string{"-holder-id", "relay-" + shard, "-shard", shard, "-lease-ttl", "3s", "-lease-renew-interval", "1s",
			"-standby-interval", "200ms", "-batch-max-rows", "50"}
	}
	a := e.start("relay-a", nil, args("a")...)
	b := e.start("relay-b", nil, args("b")...)
	procs := map[string]*testkit.Proc{"a": a, "b": b}
	leader, standby := "", ""
	for leader == "" {
		for name, p := range procs {
			if reLeader.MatchString(p.Output()) {
				leader = name
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("no leader; outputs:\n%s\n%s", a.Output(), b.Output())
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
	standby = map[string]string{"a": "b", "b": "a"}[leader]
	if _, err := procs[standby].WaitFor(ctx, reOtherName); err != nil {
		t.Fatalf("the second name was not refused loudly: %v\n%s", err, procs[standby].Output())
	}
	line, err := procs[standby].WaitFor(ctx, reHTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + reHTTPAddr.FindStringSubmatch(line)[1]
	for metricsOf(t, ctx, base)["onceflow_relay_layout_conflict"] != 1 {
		if ctx.Err() != nil {
			t.Fatal("onceflow_relay_layout_conflict never 1 on the standby")
		}
		time.Sleep(50 * time.Millisecond) // polling a condition
	}
	waitPublished(t, ctx, e, 500)
	if reLeader.MatchString(procs[standby].Output()) {
		t.Fatalf("relay %s led too", standby)
	}
	procs[leader].Kill() // mid-stream: its last batches may be on Kafka but unmarked
	<-procs[leader].Done()
	enqueue(1000, 1000)
	if _, err := procs[standby].WaitFor(ctx, reSettled); err != nil {
		t.Fatalf("relay %s did not settle the dead leader's lease: %v\n%s", standby, err, procs[standby].Output())
	}
	rep := e.check(ctx)
	if rep.Committed != 2000 || rep.Seen != 2000 {
		t.Fatalf("%d events, %d records on the topic; want 2000 of each", rep.Committed, rep.Seen)
	}
	got := publishedPerSource(t, ctx, e.topic)
	for src, seqs := range got {
		for i, s := range seqs {
			if s != int64(i+1) {
				t.Fatalf("source %s published out of order: %v", src, seqs)
			}
		}
	}
	t.Logf("relay %s led, relay %s stood by (conflict logged, gauge 1), then took over after settling: %s; %d sources in order",
		leader, standby, fmt.Sprint(rep), len(got))
}
