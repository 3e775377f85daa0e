package itest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/internal/failpoint"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/wire"
)

var (
	reStandby = regexp.MustCompile(`"msg":"standing by`)
	reEnded   = regexp.MustCompile(`"msg":"leadership ended`)
)

// fastLease makes takeovers quick for the fault tests.
var fastLease = []string{"-lease-ttl", "1s", "-lease-renew-interval", "300ms", "-standby-interval", "100ms"}

func publishedCount(t *testing.T, ctx context.Context, e *relayEnv) int {
	t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox WHERE id NOT IN (SELECT id FROM onceflow.outbox_pending)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitPublished waits until at least n rows are marked published.
func waitPublished(t *testing.T, ctx context.Context, e *relayEnv, n int) {
	t.Helper()
	for publishedCount(t, ctx, e) < n {
		if ctx.Err() != nil {
			t.Fatalf("fewer than %d rows published before the deadline", n)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
}

// crashAvro and crashProto are the schemas of TestRelayCrash's binary
// topics; the writers' payload {"n":1} fits both.
const (
	crashAvro  = `{"type":"record","name":"Tick","namespace":"crash","fields":[{"name":"n","type":"long"}]}`
	crashProto = `syntax = "proto3"; package crash; message Tick { int32 n = 1; }`
)

// TestRelayCrash SIGKILLs the relay binary 20 times at random moments while
// writers keep committing (and rolling back), then once at each forced
// failpoint: after producing but before the Kafka commit, and after the
// Kafka commit but before the PostgreSQL mark. The writers' transactions
// span three topics: one in json, one in avro and one in protobuf (through
// the schema registry). The checker then finds on each topic every
// committed event exactly once and every source in order (R1-R3), and on
// the binary ones every record framed with the registered schema's id and
// decoding with it to the payload written.
func TestRelayCrash(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	e := newRelayEnv(t, 3)
	registry := testkit.SchemaRegistryURL(t)
	reg, err := sr.NewClient(sr.URLs(registry))
	if err != nil {
		t.Fatal(err)
	}
	avroTopic, protoTopic := testkit.Topic(t, "relay-avro", 3, nil), testkit.Topic(t, "relay-proto", 3, nil)
	spec, ids := e.wireSpec(ctx, reg, map[string]wire.TopicFormat{
		avroTopic:  {Format: wire.FormatAvro, Schema: crashAvro},
		protoTopic: {Format: wire.FormatProtobuf, Schema: crashProto},
	})
	w := startWritersWith(ctx, writerPool(t, e.db.URL), e.topic, 3, 16, 4, 0.2, 0, writerExtras{Also: []string{avroTopic, protoTopic}})
	args := append([]string{"-holder-id", "crash-relay", "-topics-spec", spec, "-schema-registry-url", registry}, fastLease...)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))

	const kills = 20
	for i := range kills {
		p := e.start(fmt.Sprintf("relay-%d", i), nil, args...)
		// Kill at a random moment: sometimes during recovery, mostly
		// while publishing.
		re := reReady
		if i%4 == 0 {
			re = reLeader
		}
		if _, err := p.WaitFor(ctx, re); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond) // the random kill moment, not a synchronisation
		p.Kill()
	}
	t.Logf("after %d kills: %d published, %d committed", kills, publishedCount(t, ctx, e), w.committed.Load())

	for _, fp := range []string{failpoint.RelayBeforeKafkaCommit, failpoint.RelayAfterKafkaCommit} {
		p := e.start("relay-"+fp, []string{"ONCEFLOW_FAILPOINTS=" + fp + "=3"}, args...)
		select {
		case <-p.Done():
		case <-ctx.Done():
			t.Fatalf("relay with failpoint %s did not die", fp)
		}
		if !strings.Contains(p.Output(), "failpoint "+fp+": SIGKILL") {
			t.Fatalf("relay exited without hitting failpoint %s:\n%s", fp, p.Output())
		}
	}

	final := e.start("relay-final", nil, args...)
	waitLeader(t, ctx, final)
	w.waitCommitted(t, ctx, 1000)
	if err := w.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	dec := &wire.Decoder{Registry: reg}
	committed := 0
	for topic, format := range map[string]string{e.topic: "json", avroTopic: "avro", protoTopic: "protobuf"} {
		ck := testkit.NewChecker(t, e.db.Pool, topic)
		if id, ok := ids[topic]; ok {
			ck.Decoding(framedView(dec, id, `{"n":1}`))
		}
		rep, err := ck.Check(ctx)
		if err != nil {
			t.Fatalf("checker of %s: %v", topic, err)
		}
		t.Logf("checker of %s (%s): %s", topic, format, rep)
		if err := rep.Err(); err != nil {
			t.Fatalf("%s: %v", topic, err)
		}
		if rep.Committed < 200 {
			t.Fatalf("only %d events committed to %s: the writers did not run during the kills", rep.Committed, topic)
		}
		committed += rep.Committed
		assertNoRolledBack(t, w, ck)
	}
	if committed < 1000 {
		t.Fatalf("only %d events committed: the writers did not run during the kills", committed)
	}
}

// TestRelayZombie pauses the leader with SIGSTOP; the standby takes over
// (fencing the transactional.id); the old leader is resumed with SIGCONT.
// It must step down without publishing: the topic shows no duplicate and no
// reordering, and the zombie logs that its leadership ended.
func TestRelayZombie(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 2)
	w := startWriters(ctx, writerPool(t, e.db.URL), e.topic, 2, 8, 4, 0.1, 0)

	a := e.start("relay-a", nil, append([]string{"-holder-id", "a"}, fastLease...)...)
	if _, err := a.WaitFor(ctx, reReady); err != nil {
		t.Fatal(err)
	}
	b := e.start("relay-b", nil, append([]string{"-holder-id", "b"}, fastLease...)...)
	if _, err := b.WaitFor(ctx, reStandby); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, ctx, e, 200)

	a.Signal(syscall.SIGSTOP)
	paused := time.Now()
	if _, err := b.WaitFor(ctx, reReady); err != nil {
		t.Fatal(err)
	}
	t.Logf("standby took over %s after the leader was paused", time.Since(paused).Round(time.Millisecond))
	waitPublished(t, ctx, e, publishedCount(t, ctx, e)+300)

	a.Signal(syscall.SIGCONT)
	if _, err := a.WaitFor(ctx, reEnded); err != nil {
		t.Fatalf("zombie did not step down: %v", err)
	}
	waitPublished(t, ctx, e, publishedCount(t, ctx, e)+300)
	if err := w.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	e.check(ctx)
	if a.Exited() {
		t.Fatalf("zombie exited instead of standing by:\n%s", a.Output())
	}
}

// TestRelayTakeover SIGKILLs the leader; the standby (default lease
// settings: TTL 3s, standby tries every 500ms) must lead within 5s, and
// events enqueued after the kill are published.
func TestRelayTakeover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := newRelayEnv(t, 1)
	a := e.start("relay-a", nil, "-holder-id", "a")
	if _, err := a.WaitFor(ctx, reReady); err != nil {
		t.Fatal(err)
	}
	b := e.start("relay-b", nil, "-holder-id", "b")
	if _, err := b.WaitFor(ctx, reStandby); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		e.enqueue(ctx, fmt.Sprintf("s%d", i%3))
	}
	waitPublished(t, ctx, e, 10)

	a.Kill()
	killed := time.Now()
	if _, err := b.WaitFor(ctx, reLeader); err != nil {
		t.Fatal(err)
	}
	took := time.Since(killed)
	t.Logf("standby led %s after the leader's SIGKILL", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Fatalf("takeover took %s, want under 5s", took)
	}
	for i := range 10 {
		e.enqueue(ctx, fmt.Sprintf("s%d", i%3))
	}
	e.check(ctx)
}

// TestRelaySigterm: SIGTERM finishes the in-flight batch, releases the lease
// (expires_at = now()) and exits 0.
func TestRelaySigterm(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := newRelayEnv(t, 1)
	w := startWriters(ctx, e.db.Pool, e.topic, 2, 4, 3, 0, 0)
	p := e.start("relay", nil, "-holder-id", "term")
	if _, err := p.WaitFor(ctx, reReady); err != nil {
		t.Fatal(err)
	}
	waitPublished(t, ctx, e, 100)
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(20 * time.Second); err != nil {
		t.Fatalf("relay exit after SIGTERM: %v\n%s", err, p.Output())
	}
	var released bool
	if err := e.db.Pool.QueryRow(ctx, `SELECT expires_at <= now() FROM onceflow.relay_lease WHERE holder = 'term'`).Scan(&released); err != nil {
		t.Fatal(err)
	}
	if !released {
		t.Fatal("lease still held after SIGTERM")
	}
	if err := w.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	p2 := e.start("relay-2", nil, "-holder-id", "other")
	waitLeader(t, ctx, p2)
	e.check(ctx)
}
