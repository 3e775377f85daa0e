package itest

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/retention"
)

// TestRedeliveryDaysLaterThroughKafka: a consumer applies two events; their
// inbox rows are then two days old (moved to the time bucket of two days
// ago of their 72h lane), and a foreign producer re-sends both ids with a
// record timestamp three days on and a source the sequence guard has never
// seen (so only the inbox can tell). The consumer counts both copies
// duplicates and the handler ran once per event.
func TestRedeliveryDaysLaterThroughKafka(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	ctx := context.Background()
	policy, err := retention.Parse([]byte(`{"classes": [{"match": "*", "keep": "72h"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := retention.Prune(ctx, db.Pool, policy, retention.Options{}); err != nil { // publishes the classes
		t.Fatal(err)
	}
	// The broker takes a record timestamp up to a week ahead (its default
	// is an hour).
	topic := testkit.Topic(t, "inbox-buckets", 1, map[string]*string{"message.timestamp.after.max.ms": testkit.StringPtr("604800000")})
	cl := testkit.Client(t)
	produce(t, cl, topic, testEvent("acct", 1), testEvent("acct", 2))
	cfg := inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t)}
	e1 := startEngine(t, cfg)
	eventually(t, 60*time.Second, "both events applied", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM public.effects`)
		return n == 2, fmt.Sprintf("applied %d", n)
	})
	e1.stop(t)
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE lane = 'ttl-259200s' AND event_id IN ('acct-1', 'acct-2')`); n != 2 {
		t.Fatalf("%d rows in lane ttl-259200s, want 2", n)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets('default', 'ttl-259200s', now() - interval '48 hours')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE onceflow.inbox SET event_at = now() - interval '48 hours' WHERE event_id IN ('acct-1', 'acct-2')`); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(72 * time.Hour)
	for seq, id := range []string{"acct-1", "acct-2"} {
		ev := envelope.Envelope{EventID: id, Source: "foreign", Seq: int64(seq + 1), EventType: "test.happened", Payload: []byte(`{}`)}
		r := ev.Record(topic)
		r.Timestamp = later
		produceRecords(t, cl, r)
	}
	e2 := startEngine(t, cfg)
	eventually(t, 60*time.Second, "both copies seen", func() (bool, string) {
		d := e2.metric("onceflow_consumer_duplicates_total")
		return d == 2, fmt.Sprintf("duplicates %v", d)
	})
	e2.stop(t)
	if n := count(t, db, `SELECT count(*) FROM public.effects WHERE n <> 1`); n != 0 {
		t.Fatalf("%d events applied more than once", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE event_id IN ('acct-1', 'acct-2')`); n != 2 {
		t.Fatalf("%d inbox rows, want 2", n)
	}
}

// TestSealedBucketsThroughKafka: a consumer applies 300 events whose ids
// are the producer's own (not UUIDv7s); their rows are then two days old,
// in a past time bucket of their 72h lane, which the `consumer prune`
// binary seals, storing the filter of their ids. A foreign producer then
// re-sends every id among new ones: the consumer, reading the filters,
// counts all 300 duplicates, applies the new ones, and the handler ran once
// per event.
func TestSealedBucketsThroughKafka(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	ctx := context.Background()
	ret := writeFile(t, "retention.json", `{"classes": [{"match": "*", "keep": "72h"}]}`)
	prune := func() string {
		t.Helper()
		out, err := exec.Command(testkit.Binary(t, "consumer"), "prune", "-database-url", db.URL, "-retention-file", ret).CombinedOutput()
		if err != nil {
			t.Fatalf("consumer prune: %v\n%s", err, out)
		}
		return string(out)
	}
	prune() // publishes the classes
	topic := testkit.Topic(t, "sealed", 2, nil)
	cl := testkit.Client(t)
	const old, fresh = 300, 100
	var evs []envelope.Envelope
	for i := 1; i <= old; i++ {
		evs = append(evs, testEvent("acct", int64(i)))
	}
	produce(t, cl, topic, evs...)
	cfg := inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t)}
	e1 := startEngine(t, cfg)
	eventually(t, 60*time.Second, "the events applied", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM public.effects`)
		return n == old, fmt.Sprintf("applied %d", n)
	})
	e1.stop(t)
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets('default', 'ttl-259200s', now() - interval '48 hours')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE onceflow.inbox SET event_at = now() - interval '48 hours' WHERE event_id LIKE 'acct-%'`); err != nil {
		t.Fatal(err)
	}
	out := prune()
	m := regexp.MustCompile(`inbox buckets: 0 removed, ([0-9]+) sealed, 0 busy`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("consumer prune did not seal: %s", out)
	}
	if sealed, _ := strconv.Atoi(m[1]); sealed < 1 {
		t.Fatalf("consumer prune sealed no bucket: %s", out)
	}
	if n := count(t, db, `SELECT coalesce(sum(keys), 0)::int FROM onceflow.inbox_filters WHERE consumer = 'default'`); n != old {
		t.Fatalf("the filters hold %d ids, want %d", n, old)
	}

	var recs []*kgo.Record
	for i := 1; i <= old; i++ {
		ev := envelope.Envelope{EventID: fmt.Sprintf("acct-%d", i), Source: "foreign", Seq: int64(i), EventType: "test.happened", Payload: []byte(`{}`)}
		recs = append(recs, ev.Record(topic))
		if i <= fresh {
			ev := testEvent("fresh", int64(i))
			recs = append(recs, ev.Record(topic))
		}
	}
	produceRecords(t, cl, recs...)
	e2 := startEngine(t, cfg)
	eventually(t, 60*time.Second, "every copy a duplicate, the new events applied", func() (bool, string) {
		d, p, f := e2.metric("onceflow_consumer_duplicates_total"), e2.metric("onceflow_consumer_processed_total"), e2.metric("onceflow_consumer_sealed_filter_bytes")
		return d == old && p == fresh && f > 0, fmtState("duplicates ", d, " processed ", p, " filter bytes ", f)
	})
	e2.stop(t)
	if n := count(t, db, `SELECT count(*) FROM public.effects WHERE n <> 1`); n != 0 {
		t.Fatalf("%d events applied more than once", n)
	}
	if n := count(t, db, `SELECT count(*) FROM public.effects`); n != old+fresh {
		t.Fatalf("%d events applied, want %d", n, old+fresh)
	}
}
