package itest

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
)

// gatedSQL applies an event like appliedSQL, but fails (division by zero)
// while public.gate names the event: the handler is retried with backoff
// until the test removes the gate.
const gatedSQL = `WITH gate AS (SELECT 1 / (CASE WHEN EXISTS (SELECT 1 FROM public.gate WHERE event_id = :event_id) THEN 0 ELSE 1 END) AS ok)
INSERT INTO public.applied (event_id, source, seq, late) SELECT :event_id, :source, :seq, :late FROM gate WHERE ok = 1`

// TestConsumerStaleFetchThenKill is the stale-fetch scenario against the
// real broker and the consumer binary. Topic X's worker is held in retry
// backoff (its 3rd event is gated) and topic Y's too (its 151st), while X
// and Y records keep arriving; then Y is revoked (a second member that
// subscribes to Y only joins the group) and assigned back to the same
// process (it leaves). X's gate is lifted, the process works until X is
// applied, and is SIGKILLed while Y's worker is stuck at Y's 151st event.
// A batch polled before the reassignment must not have reached Y's new
// worker (it would have stored a next offset past 151-…, and the restart
// would skip them): after the restart and Y's gate lifted, every event is
// applied once, in seq order, no gap given up, nothing late.
func TestConsumerStaleFetchThenKill(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := seqDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.gate (event_id text PRIMARY KEY);
	    INSERT INTO public.gate VALUES ('x-3'), ('y-151')`); err != nil {
		t.Fatal(err)
	}
	tx := testkit.Topic(t, "stale-x", 1, nil)
	ty := testkit.Topic(t, "stale-y", 1, nil)
	group := "g-" + ty
	bin := testkit.Binary(t, "consumer")
	env := []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=" + group,
		"ONCEFLOW_TOPICS=" + tx + "," + ty,
		"ONCEFLOW_HANDLERS_FILE=" + writeFile(t, "handlers.json", fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "sql", "sql": %q}]}`, gatedSQL)),
		"ONCEFLOW_HTTP_ADDR=",
		"ONCEFLOW_BATCH_MAX_RECORDS=10",
		// Static membership: the restart takes the partitions back at once.
		"ONCEFLOW_INSTANCE_ID=stale-" + ty,
		"ONCEFLOW_RETRY_INITIAL_INTERVAL=100ms",
		"ONCEFLOW_RETRY_MAX_INTERVAL=200ms",
		"ONCEFLOW_RETRY_MAX_ATTEMPTS=100000",
		"ONCEFLOW_RETRY_MAX_ELAPSED=1h",
		"ONCEFLOW_GAP_TIMEOUT=3s",
		"ONCEFLOW_GAP_CHECK_INTERVAL=100ms",
		"ONCEFLOW_FAILPOINTS=",
	}
	cl := testkit.Client(t)
	next := map[string]int64{"x": 1, "y": 1}
	events := func(source, topic string, n int) []*kgo.Record {
		var recs []*kgo.Record
		for range n {
			ev := testEvent(source, next[source])
			recs = append(recs, ev.Record(topic))
			next[source]++
		}
		return recs
	}
	send := func(source, topic string, n int) { produceRecords(t, cl, events(source, topic, n)...) }
	send("x", tx, 5)
	send("y", ty, 150)
	p := testkit.Start(t, "consumer-1", bin, env, "run")
	eventually(t, 60*time.Second, "x 1-2 and y 1-150 applied, both workers held at their gates", func() (bool, string) {
		x, y := appliedOrder(t, db, "x"), appliedOrder(t, db, "y")
		return x == "1 2" && y == seqRange(1, 150), fmtState("x ", x, " y ", len(strings.Fields(y)))
	})
	// More of both keep arriving while both workers are held: their queues
	// fill up and polled batches wait.
	// (One produce call for both, so that fetches carry records of both.)
	for range 12 {
		produceRecords(t, cl, append(events("x", tx, 5), events("y", ty, 5)...)...)
		time.Sleep(50 * time.Millisecond)
	}

	// Y is revoked (a member subscribing to Y only joins) and assigned to
	// the same process again (it leaves).
	revoked := regexp.MustCompile(`"msg":"partitions revoked","partitions":"` + regexp.QuoteMeta(ty))
	assignedAgain := regexp.MustCompile(`"msg":"partitions assigned","partitions":"[^"]*` + regexp.QuoteMeta(ty))
	other, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(t), ",")...), kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(ty), kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.DisableAutoCommit())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitFor(ctx, revoked); err != nil {
		other.Close()
		t.Fatalf("y never revoked: %v", err)
	}
	other.Close() // leaves the group
	if _, err := p.WaitFor(ctx, assignedAgain); err != nil {
		t.Fatalf("y never assigned back: %v", err)
	}

	// X goes on; once it is all applied, anything polled before the
	// reassignment has long been dispatched. Then the crash.
	if _, err := db.Pool.Exec(ctx, `DELETE FROM public.gate WHERE event_id = 'x-3'`); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "x applied", func() (bool, string) {
		x := appliedOrder(t, db, "x")
		return x == seqRange(1, next["x"]-1), "x " + x
	})
	p.Kill()

	if _, err := db.Pool.Exec(ctx, `DELETE FROM public.gate`); err != nil {
		t.Fatal(err)
	}
	p2 := testkit.Start(t, "consumer-2", bin, env, "run")
	eventually(t, 60*time.Second, "y applied", func() (bool, string) {
		y := appliedOrder(t, db, "y")
		g := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`)
		if g > 0 {
			var lost string
			_ = db.Pool.QueryRow(ctx, `SELECT string_agg(source || ' ' || from_seq || '-' || to_seq, ', ') FROM onceflow.seq_gaps WHERE state = 'given_up'`).Scan(&lost)
			t.Fatalf("%d gaps given up: events lost (%s); %d y events applied", g, lost, len(strings.Fields(y)))
		}
		return y == seqRange(1, next["y"]-1), fmtState("y ", len(strings.Fields(y)), " of ", next["y"]-1)
	})
	p2.Signal(syscall.SIGTERM)
	if err := p2.Wait(60 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if n := count(t, db, `SELECT count(*) FROM public.applied WHERE late`); n != 0 {
		t.Fatalf("%d events applied late", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`); n != 0 {
		t.Fatalf("%d gaps given up", n)
	}
	t.Logf("x: %d events, y: %d events, y revoked and assigned back while both were held, SIGKILL, restart: all applied once in order, 0 gaps given up, 0 late",
		next["x"]-1, next["y"]-1)
}
