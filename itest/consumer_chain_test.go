package itest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
)

var relayLeaderLine = regexp.MustCompile(`"msg":"leadership acquired"`)

// TestConsumerChainThroughRelay: topic A → consumer whose sql handler
// enqueues one B per A (onceflow.enqueue in the inbox transaction) → relay →
// topic B, with the consumer and the relay each SIGKILLed several times
// under load. Topic B, read with read_committed, holds exactly one B per A,
// each source in seq order.
func TestConsumerChainThroughRelay(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := consumerDB(t)
	topicA := testkit.Topic(t, "chain-a", 3, nil)
	topicB := testkit.Topic(t, "chain-b", 3, nil)
	ckpt := testkit.Topic(t, "chain-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})

	handlers := filepath.Join(t.TempDir(), "chain.json")
	spec := fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "sql",
		"sql": "SELECT onceflow.enqueue('%s', :source, 'b.derived', :payload::jsonb, 'b:' || :event_id)"}]}`, topicB)
	if err := os.WriteFile(handlers, []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
	consumerBin, relayBin := testkit.Binary(t, "consumer"), testkit.Binary(t, "relay")
	consumerEnv := []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + topicA,
		"ONCEFLOW_TOPICS=" + topicA,
		"ONCEFLOW_HANDLERS_FILE=" + handlers,
		"ONCEFLOW_HTTP_ADDR=",
		"ONCEFLOW_INSTANCE_ID=chain-consumer",
		"ONCEFLOW_BATCH_MAX_RECORDS=40",
	}
	startConsumer := func(i int) *testkit.Proc {
		p := testkit.Start(t, fmt.Sprintf("consumer-%d", i), consumerBin, consumerEnv, "run")
		if _, err := p.WaitFor(ctx, assignedLine); err != nil {
			t.Fatalf("consumer %d: %v", i, err)
		}
		return p
	}
	startRelay := func(i int) *testkit.Proc {
		p := testkit.Start(t, fmt.Sprintf("relay-%d", i), relayBin, nil, "run",
			"-database-url", db.URL, "-kafka-brokers", testkit.KafkaBrokers(t),
			"-checkpoint-topic", ckpt, "-transactional-id-prefix", "chain-"+topicB+"-",
			"-holder-id", "chain-relay", "-http-addr", "", "-lease-ttl", "2s", "-lease-renew-interval", "500ms")
		if _, err := p.WaitFor(ctx, relayLeaderLine); err != nil {
			t.Fatalf("relay %d: %v", i, err)
		}
		return p
	}

	load := startLoad(t, topicA, 5, 10*time.Millisecond)
	consumer, relay := startConsumer(0), startRelay(0)
	for i := 1; i <= 8; i++ {
		time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond) // a random moment
		if i%2 == 1 {
			consumer.Kill()
			consumer = startConsumer(i)
		} else {
			relay.Kill()
			relay = startRelay(i)
		}
	}
	want := load.finish()

	eventually(t, 2*time.Minute, "one outbox row per A event", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM onceflow.outbox WHERE topic = $1`, topicB)
		return n >= len(want), fmtState(n, " of ", len(want))
	})
	ck := testkit.NewChecker(t, db.Pool, topicB)
	rep, err := ck.Check(ctx)
	if err != nil {
		t.Fatalf("checker: %v (%s)", err, rep)
	}
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.Seen != len(want) || rep.Committed != len(want) {
		t.Fatalf("topic B: %s, want %d", rep, len(want))
	}
	for id := range want {
		if ck.Count("b:"+id) != 1 {
			t.Fatalf("B for %s seen %d times", id, ck.Count("b:"+id))
		}
	}
	consumer.Signal(syscall.SIGTERM)
	relay.Signal(syscall.SIGTERM)
	if err := consumer.Wait(60 * time.Second); err != nil {
		t.Errorf("consumer SIGTERM: %v", err)
	}
	t.Logf("%d A events, one B each, in order per source; 4 consumer and 4 relay SIGKILLs", len(want))
}
