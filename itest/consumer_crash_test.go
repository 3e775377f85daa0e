package itest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// loadProducer produces events of many sources to topic until stopped and
// remembers every event id.
type loadProducer struct {
	mu   sync.Mutex
	ids  map[string]bool
	stop chan struct{}
	done chan struct{}
}

func startLoad(t *testing.T, topic string, perTick int, tick time.Duration) *loadProducer {
	t.Helper()
	cl := testkit.Client(t)
	lp := &loadProducer{ids: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(lp.done)
		seqs := map[string]int64{}
		tk := time.NewTicker(tick)
		defer tk.Stop()
		for i := 0; ; i++ {
			evs := make([]envelope.Envelope, perTick)
			for j := range evs {
				src := fmt.Sprintf("src-%d", (i*perTick+j)%40)
				seqs[src]++
				evs[j] = testEvent(src, seqs[src])
			}
			produce(t, cl, topic, evs...)
			lp.mu.Lock()
			for _, ev := range evs {
				lp.ids[ev.EventID] = true
			}
			lp.mu.Unlock()
			select {
			case <-lp.stop:
				return
			case <-tk.C:
			}
		}
	}()
	return lp
}

// finish stops producing and returns every event id produced.
func (lp *loadProducer) finish() map[string]bool {
	select {
	case <-lp.stop:
	default:
		close(lp.stop)
	}
	<-lp.done
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.ids
}

var assignedLine = regexp.MustCompile(`"msg":"partitions assigned"`)

// TestConsumerCrashInjection runs the consumer binary under load and
// SIGKILLs it 20 times at random moments, then once at each forced point
// (after the handler's writes before the Postgres commit; after the
// Postgres commit before the Kafka offset commit). Afterwards every event's
// side effect exists exactly once, and a SIGTERM drains and exits 0.
func TestConsumerCrashInjection(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	topic := testkit.Topic(t, "crash", 3, nil)
	bin := testkit.Binary(t, "consumer")
	env := []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + topic,
		"ONCEFLOW_TOPICS=" + topic,
		"ONCEFLOW_HANDLERS_FILE=" + handlersFile(t),
		"ONCEFLOW_HTTP_ADDR=",
		"ONCEFLOW_INSTANCE_ID=crash-consumer",
		"ONCEFLOW_BATCH_MAX_RECORDS=40",
		"ONCEFLOW_FAILPOINTS=",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	load := startLoad(t, topic, 10, 10*time.Millisecond)

	for i := range 20 {
		p := testkit.Start(t, fmt.Sprintf("consumer-%d", i), bin, env, "run")
		if _, err := p.WaitFor(ctx, assignedLine); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, p.Output())
		}
		// A random moment while it works through the load.
		time.Sleep(time.Duration(rand.IntN(700)) * time.Millisecond)
		p.Kill()
	}
	for _, fp := range []string{"consumer-after-handler", "consumer-after-pg-commit"} {
		fenv := append(append([]string{}, env...), "ONCEFLOW_FAILPOINTS="+fp+"=3")
		p := testkit.Start(t, fp, bin, fenv, "run")
		select {
		case <-p.Done():
		case <-ctx.Done():
			t.Fatalf("%s: the failpoint never fired", fp)
		}
		if !strings.Contains(p.Output(), "failpoint "+fp+": SIGKILL") {
			t.Fatalf("%s: process ended without the failpoint:\n%s", fp, p.Output())
		}
	}
	want := load.finish()

	p := testkit.Start(t, "consumer-final", bin, env, "run")
	eventually(t, 2*time.Minute, "every produced event applied", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM public.effects`)
		return n >= len(want), fmtState(n, " of ", len(want), " applied")
	})
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(60 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.Output())
	}
	checkEffects(t, db, want)
	checkOrdered(t, db)
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed'`); n != len(want) {
		t.Fatalf("%d processed inbox rows, want %d", n, len(want))
	}
	t.Logf("%d events, 22 crashes, per-source order kept, 0 gaps given up, 0 late", len(want))
}

var assignedSome = regexp.MustCompile(`"msg":"partitions assigned","partitions":"[^"]+"`)

// TestConsumerCrashDynamicMembers is the crash test with dynamic group
// membership (no -instance-id) and overlapping members: each round starts a
// new consumer process while the previous one still runs, waits until the
// group has given the newcomer partitions (the two share the topic), and
// SIGKILLs the older one at a random moment — a zombie whose partitions the
// group reassigns only after its session times out (6 s), while the newer
// member and the next newcomer keep consuming. Afterwards every event is
// applied exactly once, in per-source seq order, no gap given up, none late.
func TestConsumerCrashDynamicMembers(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	topic := testkit.Topic(t, "crashdyn", 3, nil)
	bin := testkit.Binary(t, "consumer")
	env := []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + topic,
		"ONCEFLOW_TOPICS=" + topic,
		"ONCEFLOW_HANDLERS_FILE=" + handlersFile(t),
		"ONCEFLOW_HTTP_ADDR=",
		"ONCEFLOW_INSTANCE_ID=",
		"ONCEFLOW_SESSION_TIMEOUT=6s",
		"ONCEFLOW_BATCH_MAX_RECORDS=40",
		"ONCEFLOW_FAILPOINTS=",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	load := startLoad(t, topic, 10, 10*time.Millisecond)
	const rounds = 3
	prev := testkit.Start(t, "consumer-0", bin, env, "run")
	if _, err := prev.WaitFor(ctx, assignedSome); err != nil {
		t.Fatalf("consumer-0: %v", err)
	}
	for i := 1; i <= rounds; i++ {
		p := testkit.Start(t, fmt.Sprintf("consumer-%d", i), bin, env, "run")
		if _, err := p.WaitFor(ctx, assignedSome); err != nil {
			t.Fatalf("consumer-%d never got partitions: %v\n%s", i, err, p.Output())
		}
		time.Sleep(time.Duration(rand.IntN(500)) * time.Millisecond) // a random moment while both consume
		prev.Kill()
		prev = p
	}
	want := load.finish()
	eventually(t, 2*time.Minute, "every produced event applied", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM public.effects`)
		return n >= len(want), fmtState(n, " of ", len(want), " applied")
	})
	prev.Signal(syscall.SIGTERM)
	if err := prev.Wait(60 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	checkEffects(t, db, want)
	checkOrdered(t, db)
	t.Logf("%d events, %d overlapping dynamic members, %d SIGKILLs, per-source order kept, 0 gaps given up, 0 late", len(want), rounds+1, rounds)
}
