package itest

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/failpoint"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/relay"
)

var (
	reOtherCount = regexp.MustCompile(`"msg":"standing by: relays with another shard count hold leases`)
	reSettled    = regexp.MustCompile(`"msg":"settled a shard of another shard count[^"]*".*"marked":(\d+)`)
)

// startShard runs the relay of shard k of n.
func (e *relayEnv) startShard(name string, env []string, k, n int, args ...string) *testkit.Proc {
	e.t.Helper()
	return e.start(name, env, append([]string{"-shards", strconv.Itoa(n), "-shard", strconv.Itoa(k)}, args...)...)
}

// checkpointShards reads the checkpoint topic (read_committed, to its last
// stable offset) and returns, per checkpoint key, the outbox ids its records
// name.
func checkpointShards(t *testing.T, ctx context.Context, topic string) map[string][]int64 {
	t.Helper()
	adm := kadm.NewClient(testkit.Client(t))
	lso, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = lso.Error()
	}
	if err != nil {
		t.Fatalf("checkpoint topic offsets: %v", err)
	}
	end := lso[topic][0].Offset
	cl := testkit.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	ids := map[string][]int64{}
	var last int64 = -1
	for last < end-1 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read checkpoint topic to offset %d: %v", end, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			last = r.Offset
			if r.Attrs.IsControl() {
				return
			}
			// "v2 db=<identity> ids=12-40,44 fp=…"
			for _, f := range strings.Fields(string(r.Value)) {
				rs, ok := strings.CutPrefix(f, "ids=")
				if !ok {
					continue
				}
				for _, part := range strings.Split(rs, ",") {
					lo, hi, isRange := strings.Cut(part, "-")
					a, _ := strconv.ParseInt(lo, 10, 64)
					b := a
					if isRange {
						b, _ = strconv.ParseInt(hi, 10, 64)
					}
					for id := a; id <= b; id++ {
						ids[string(r.Key)] = append(ids[string(r.Key)], id)
					}
				}
			}
		})
	}
	return ids
}

// assertShardsOwnTheirRows checks that every row a shard's checkpoints
// name belongs to a source of that shard: each shard published only its own
// rows, and both published some.
func assertShardsOwnTheirRows(t *testing.T, ctx context.Context, e *relayEnv, n int) {
	t.Helper()
	var identity string
	if err := e.db.Pool.QueryRow(ctx, `SELECT id::text FROM onceflow.database_identity`).Scan(&identity); err != nil {
		t.Fatal(err)
	}
	byKey := checkpointShards(t, ctx, e.checkpoint)
	for k := range n {
		key := relay.CheckpointKey(identity, strconv.Itoa(k))
		ids := byKey[key]
		if len(ids) == 0 {
			t.Fatalf("no checkpoint under %q: shard %d published nothing (keys: %v)", key, k, keysOf(byKey))
		}
		rows, err := e.db.Pool.Query(ctx, `SELECT source, count(*) FROM onceflow.outbox WHERE id = ANY($1) GROUP BY source`, ids)
		if err != nil {
			t.Fatal(err)
		}
		sources := 0
		for rows.Next() {
			var source string
			var c int
			if err := rows.Scan(&source, &c); err != nil {
				t.Fatal(err)
			}
			if got := relay.SourceShard(source, n); got != k {
				t.Errorf("shard %d's checkpoints name %d rows of source %q, which is shard %d's", k, c, source, got)
			}
			sources++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		t.Logf("shard %d: its checkpoints name %d rows of %d sources, all its own", k, len(ids), sources)
	}
}

// waitMetric waits until the relay at base reports want for metric.
func waitMetric(t *testing.T, ctx context.Context, base, metric string, want float64) {
	t.Helper()
	for {
		got, ok := metricsOf(t, ctx, base)[metric]
		if ok && got == want {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: %s is %v (reported: %v), want %v", base, metric, got, ok, want)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition
	}
}

func keysOf(m map[string][]int64) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestRelayShardsCrash: two shards publish one database while writers
// commit and roll back. Shard 1's relay is SIGKILLed mid-batch, once right
// after a Kafka commit (rows on Kafka, not marked) and once right before
// one (transaction open), and restarted each time; shard 0's relay runs
// throughout and must never lose its lease. On the topic (read_committed)
// every committed event is there once and every source in order; each
// shard's checkpoints name only rows of its own sources.
func TestRelayShardsCrash(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 3)
	w := startWriters(ctx, writerPool(t, e.db.URL), e.topic, 3, 16, 4, 0.2, 0)

	// Shard 0 keeps the default lease timing: it must lead throughout,
	// also on a loaded machine.
	s0 := e.startShard("shard-0", nil, 0, 2, "-holder-id", "s0")
	if _, err := s0.WaitFor(ctx, reReady); err != nil {
		t.Fatal(err)
	}
	line, err := s0.WaitFor(ctx, reHTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	s0URL := "http://" + reHTTPAddr.FindStringSubmatch(line)[1]
	// No relay of shard 1 yet: shard 0's leader says so.
	waitMetric(t, ctx, s0URL, "onceflow_relay_shards_without_leader", 1)
	kills := 0
	for _, fp := range []string{failpoint.RelayAfterKafkaCommit, failpoint.RelayBeforeKafkaCommit} {
		p := e.startShard("shard-1-"+fp, []string{"ONCEFLOW_FAILPOINTS=" + fp + "=4"}, 1, 2, append([]string{"-holder-id", "s1"}, fastLease...)...)
		if out := waitExit(t, ctx, p); !strings.Contains(out, "failpoint "+fp+": SIGKILL") {
			t.Fatalf("shard 1 exited without hitting failpoint %s:\n%s", fp, out)
		}
		kills++
	}
	s1 := e.startShard("shard-1", nil, 1, 2, append([]string{"-holder-id", "s1"}, fastLease...)...)
	if _, err := s1.WaitFor(ctx, reReady); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, ctx, e, publishedCount(t, ctx, e)+300)
	waitMetric(t, ctx, s0URL, "onceflow_relay_shards_without_leader", 0)
	w.waitCommitted(t, ctx, 500)
	if err := w.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	rep := e.check(ctx)
	if rep.Committed < 500 {
		t.Fatalf("only %d events committed: the writers did not run during the kills", rep.Committed)
	}
	if s0.Exited() || reEnded.MatchString(s0.Output()) {
		t.Fatalf("shard 0's relay lost its lease while shard 1 crashed:\n%s", s0.Output())
	}
	if strings.Contains(s0.Output()+s1.Output(), "row of another shard") {
		t.Fatal("a shard's recovery met another shard's row")
	}
	assertShardsOwnTheirRows(t, ctx, e, 2)
	t.Logf("%d SIGKILLs of shard 1 at failpoints; shard 0 led throughout", kills)
}

// TestRelayShardsFence: two relays of shard 0 (and one of shard 1) run. The
// first leader of shard 0 freezes right before a Kafka commit; the other
// relay of shard 0 takes its lease over and fences its transactional.id, so
// that the frozen leader's commit is refused when it resumes. Shard 1 keeps
// its own leader throughout: one leader per shard.
func TestRelayShardsFence(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 2)
	w := startWriters(ctx, writerPool(t, e.db.URL), e.topic, 2, 16, 4, 0.1, 0)
	// A lease that outlives the second relay's start, and a transaction
	// timeout that outlives the freeze.
	args := []string{"-transaction-timeout", "60s", "-lease-ttl", "3s", "-lease-renew-interval", "1s", "-standby-interval", "100ms"}

	s1 := e.startShard("shard-1", nil, 1, 2, append([]string{"-holder-id", "s1"}, args...)...)
	a := e.startShard("shard-0-a", []string{"ONCEFLOW_FAILPOINTS=" + failpoint.RelayBeforeKafkaCommit + "=50:stop"}, 0, 2,
		append([]string{"-holder-id", "a"}, args...)...)
	if _, err := a.WaitFor(ctx, reReady); err != nil {
		t.Fatal(err)
	}
	b := e.startShard("shard-0-b", nil, 0, 2, append([]string{"-holder-id", "b"}, args...)...)
	if _, err := b.WaitFor(ctx, reStandby); err != nil {
		t.Fatalf("the second relay of shard 0 did not stand by: %v", err)
	}
	if _, err := a.WaitFor(ctx, regexp.MustCompile(`failpoint `+failpoint.RelayBeforeKafkaCommit+`: SIGSTOP`)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitFor(ctx, reReady); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, ctx, e, publishedCount(t, ctx, e)+200)
	a.Signal(syscall.SIGCONT)
	if _, err := a.WaitFor(ctx, reEnded); err != nil {
		t.Fatalf("the frozen leader did not step down: %v", err)
	}
	out := a.Output()
	if after := out[strings.LastIndex(out, "SIGSTOP"):]; !reFenced.MatchString(after) {
		t.Errorf("the frozen leader's commit was not refused by the broker; its output after resuming:\n%s", after)
	}
	waitPublished(t, ctx, e, publishedCount(t, ctx, e)+200)
	if err := w.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	e.check(ctx)
	if reEnded.MatchString(s1.Output()) || reStandby.MatchString(s1.Output()) {
		t.Fatalf("shard 1's relay did not lead throughout:\n%s", s1.Output())
	}
	var leases []string
	rows, err := e.db.Pool.Query(ctx, `SELECT shard || '=' || holder FROM onceflow.relay_lease WHERE shards = 2 ORDER BY shard`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if got := strings.Join(leases, " "); got != "0=b 1=s1" {
		t.Fatalf("leases %q, want 0=b 1=s1", got)
	}
}

// TestRelayShardsChangeCount: a relay with one shard freezes right after a
// Kafka commit (rows on Kafka, not marked); relays with two shards started
// beside it take no lease while its lease lives. It is SIGKILLed, and once
// its lease has expired the two-shard relays settle its checkpoint (fence
// its transactional.id, mark the rows it names) before either publishes:
// nothing is published twice and every source stays in order, although the
// unmarked rows' sources now belong to either shard.
func TestRelayShardsChangeCount(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 2)
	w := startWriters(ctx, writerPool(t, e.db.URL), e.topic, 2, 16, 4, 0.1, 0)

	// Its lease outlives the two-shard relays' start.
	one := e.start("one-shard", []string{"ONCEFLOW_FAILPOINTS=" + failpoint.RelayAfterKafkaCommit + "=5:stop"},
		"-holder-id", "one", "-lease-ttl", "10s", "-lease-renew-interval", "2s")
	if _, err := one.WaitFor(ctx, regexp.MustCompile(`failpoint `+failpoint.RelayAfterKafkaCommit+`: SIGSTOP`)); err != nil {
		t.Fatal(err)
	}
	s0 := e.startShard("shard-0", nil, 0, 2, append([]string{"-holder-id", "s0"}, fastLease...)...)
	s1 := e.startShard("shard-1", nil, 1, 2, append([]string{"-holder-id", "s1"}, fastLease...)...)
	for _, s := range []*testkit.Proc{s0, s1} {
		if _, err := s.WaitFor(ctx, reOtherCount); err != nil {
			t.Fatalf("%s did not wait for the one-shard relay: %v", s.Name, err)
		}
	}
	one.Kill()
	for _, s := range []*testkit.Proc{s0, s1} {
		if _, err := s.WaitFor(ctx, reReady); err != nil {
			t.Fatal(err)
		}
	}
	waitPublished(t, ctx, e, publishedCount(t, ctx, e)+200)
	if err := w.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	e.check(ctx)
	marked := 0
	for _, s := range []*testkit.Proc{s0, s1} {
		for _, m := range reSettled.FindAllStringSubmatch(s.Output(), -1) {
			n, _ := strconv.Atoi(m[1])
			marked += n
		}
	}
	if marked == 0 {
		t.Fatalf("no relay settled the one-shard relay's checkpoint with rows to mark:\n%s\n%s", s0.Output(), s1.Output())
	}
	t.Logf("the two-shard relays marked %d rows the one-shard relay had left on Kafka unmarked", marked)
}
