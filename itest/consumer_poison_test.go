package itest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// TestConsumerPoison: an event the handler cannot apply (the effects table's
// CHECK rejects source "poison") is retried, dead-lettered with its error,
// and its neighbours before and after are applied: the partition keeps
// moving. Once the cause is fixed, `consumer dlq replay` applies it once; a
// second replay is a no-op. The DLQ topic receives a copy with the reason.
func TestConsumerPoison(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := consumerDB(t)
	topic := testkit.Topic(t, "poison", 1, nil)
	dlq := testkit.Topic(t, "poison-dlq", 1, nil)
	cl := testkit.Client(t)
	want := map[string]bool{}
	var evs []envelope.Envelope
	// order-9's seqs stay contiguous (1–19) around the poison event, so the
	// sequence guard has no gap to wait for.
	seq := int64(0)
	for i := int64(1); i <= 20; i++ {
		var ev envelope.Envelope
		if i == 10 {
			ev = testEvent("poison", 1)
		} else {
			seq++
			ev = testEvent("order-9", seq)
			want[ev.EventID] = true
		}
		evs = append(evs, ev)
	}
	produce(t, cl, topic, evs...)

	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic},
		BatchHandler: sqlHandler(t), RetryMaxAttempts: 3, DLQTopic: dlq})
	eventually(t, 30*time.Second, "poison dead-lettered and neighbours applied", func() (bool, string) {
		p, d := e.metric("onceflow_consumer_processed_total"), e.metric("onceflow_consumer_dead_lettered_total")
		return p == 19 && d == 1, fmtState("processed ", p, ", dead-lettered ", d)
	})
	// Not stalled: later events still flow.
	for i := int64(20); i <= 24; i++ {
		ev := testEvent("order-9", i)
		want[ev.EventID] = true
		produce(t, cl, topic, ev)
	}
	eventually(t, 30*time.Second, "events after the poison applied", func() (bool, string) {
		p := e.metric("onceflow_consumer_processed_total")
		return p == 24, fmtState("processed ", p)
	})
	e.stop(t)
	// One failed batch, then three isolated tries.
	if he := e.metric("onceflow_consumer_handler_errors_total"); he != 4 {
		t.Fatalf("handler errors %v, want 4 (the batch, then 3 tries of the event)", he)
	}
	checkEffects(t, db, want)
	var status, lastErr string
	var attempts int
	var payload []byte
	if err := db.Pool.QueryRow(ctx, `SELECT status, attempts, last_error, payload FROM onceflow.inbox WHERE event_id = 'poison-1'`).
		Scan(&status, &attempts, &lastErr, &payload); err != nil {
		t.Fatal(err)
	}
	if status != "dead" || attempts != 3 || !strings.Contains(lastErr, "effects_not_poison") || len(payload) == 0 {
		t.Fatalf("dead letter row: status %s attempts %d last_error %q payload %d bytes", status, attempts, lastErr, len(payload))
	}
	// The DLQ copy carries the reason.
	dl := testkit.ReadCommittedClient(t, dlq)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var copyRec *kgo.Record
	for copyRec == nil && rctx.Err() == nil {
		dl.PollFetches(rctx).EachRecord(func(r *kgo.Record) { copyRec = r })
	}
	if copyRec == nil || !strings.Contains(headerValue(copyRec, inbox.DLQErrorHeader), "effects_not_poison") {
		t.Fatalf("DLQ topic copy: %v", copyRec)
	}

	// Operators: list, fix the cause, replay once.
	bin := testkit.Binary(t, "consumer")
	env := []string{"ONCEFLOW_DATABASE_URL=" + db.URL, "ONCEFLOW_HANDLERS_FILE=" + handlersFile(t)}
	out := runBin(t, bin, env, "dlq", "list")
	if !strings.Contains(out, "poison-1") || !strings.Contains(out, "dead") {
		t.Fatalf("dlq list:\n%s", out)
	}
	if out, err := runBinErr(bin, env, "dlq", "replay", "poison-1"); err == nil || !strings.Contains(out, "effects_not_poison") {
		t.Fatalf("replay before the fix: err %v, output:\n%s", err, out)
	}
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE public.effects DROP CONSTRAINT effects_not_poison`); err != nil {
		t.Fatal(err)
	}
	if out := runBin(t, bin, env, "dlq", "replay", "poison-1"); !strings.Contains(out, "replayed") {
		t.Fatalf("replay: %s", out)
	}
	if out := runBin(t, bin, env, "dlq", "replay", "poison-1"); !strings.Contains(out, "already processed") {
		t.Fatalf("second replay: %s", out)
	}
	want["poison-1"] = true
	checkEffects(t, db, want)
	if out := runBin(t, bin, env, "dlq", "list"); strings.Contains(out, "poison-1") {
		t.Fatalf("dlq list after replay still shows it:\n%s", out)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT status, attempts FROM onceflow.inbox WHERE event_id = 'poison-1'`).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "processed" || attempts != 4 {
		t.Fatalf("after replay: status %s attempts %d, want processed 4", status, attempts)
	}
}

// TestConsumerMalformed: records that break the envelope contract are
// dead-lettered with a reason under a fallback key and counted; they never
// stop the partition, and a redelivery of one is a duplicate.
func TestConsumerMalformed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := consumerDB(t)
	topic := testkit.Topic(t, "malformed", 1, nil)
	cl := testkit.Client(t)

	good1, good2 := testEvent("order-3", 1), testEvent("order-3", 2)
	rec := func(source string, seq int64) *kgo.Record { ev := testEvent(source, seq); return ev.Record(topic) }
	noSeq := rec("order-4", 1)
	noSeq.Headers = dropHeader(noSeq.Headers, envelope.HeaderSeq)
	noID := rec("order-4", 2)
	noID.Headers = dropHeader(noID.Headers, envelope.HeaderEventID)
	badJSON := rec("order-4", 3)
	badJSON.Value = []byte("{not json")
	big := rec("order-4", 4)
	big.Value = []byte(`"` + strings.Repeat("x", 2000) + `"`)
	nul := rec("order-4", 5)
	nul.Headers = append(dropHeader(nul.Headers, envelope.HeaderSource), kgo.RecordHeader{Key: "source", Value: []byte("a\x00b\xff")})
	// An event id squatting on the key the next record gets if malformed,
	// and that next record, whose seq is not canonical.
	squatter := rec("order-5", 1)
	squatter.Headers = append(dropHeader(squatter.Headers, envelope.HeaderEventID),
		kgo.RecordHeader{Key: envelope.HeaderEventID, Value: fmt.Appendf(nil, "malformed:%s:0:8", topic)})
	plusSeq := rec("order-5", 2)
	plusSeq.Headers = append(dropHeader(plusSeq.Headers, envelope.HeaderSeq), kgo.RecordHeader{Key: envelope.HeaderSeq, Value: []byte("+2")})
	produceRecords(t, cl, good1.Record(topic), noSeq, noID, badJSON, big, nul, good2.Record(topic), squatter, plusSeq)

	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic},
		BatchHandler: sqlHandler(t), MaxPayloadBytes: 1000})
	eventually(t, 30*time.Second, "good events applied, malformed dead-lettered", func() (bool, string) {
		p, m, d := e.metric("onceflow_consumer_processed_total"), e.metric("onceflow_consumer_malformed_total"), e.metric("onceflow_consumer_dead_lettered_total")
		return p == 2 && m == 7 && d == 7, fmtState("processed ", p, ", malformed ", m, ", dead ", d)
	})
	e.stop(t)
	checkEffects(t, db, map[string]bool{good1.EventID: true, good2.EventID: true})
	reasons := map[string]string{}
	rows, err := db.Pool.Query(ctx, `SELECT event_id, last_error FROM onceflow.inbox WHERE status = 'dead' ORDER BY kafka_offset`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, reason string
		if err := rows.Scan(&id, &reason); err != nil {
			t.Fatal(err)
		}
		reasons[id] = reason
	}
	wantReasons := map[int]string{1: "seq is missing", 2: "event-id is missing", 3: "not valid JSON", 4: "over the limit", 5: "source",
		7: `must not start with "malformed:"`, 8: "not a canonical decimal integer"}
	var topicID string
	if err := db.Pool.QueryRow(ctx, `SELECT topic_id FROM onceflow.consumer_offsets WHERE topic = $1`, topic).Scan(&topicID); err != nil {
		t.Fatal(err)
	}
	for off, frag := range wantReasons {
		// Keyed by the topic's ID too: see TestConsumerMalformedAcrossTopicRecreation.
		id := fmt.Sprintf("malformed:%s:%s:0:%d", topic, topicID, off)
		if !strings.Contains(reasons[id], frag) {
			t.Errorf("dead letter %s: reason %q, want it to mention %q", id, reasons[id], frag)
		}
	}

	// Re-consume everything from the start in a fresh group with the same
	// consumer name: every record, malformed ones included, is a duplicate.
	e2 := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g2-" + topic, Topics: []string{topic},
		BatchHandler: sqlHandler(t), MaxPayloadBytes: 1000})
	eventually(t, 30*time.Second, "all duplicates", func() (bool, string) {
		d := e2.metric("onceflow_consumer_duplicates_total")
		return d == 9, fmtState("duplicates ", d)
	})
	e2.stop(t)
	if n := e2.metric("onceflow_consumer_dead_lettered_total"); n != 0 {
		t.Fatalf("second pass dead-lettered %v", n)
	}
}

func dropHeader(hs []kgo.RecordHeader, name string) []kgo.RecordHeader {
	var out []kgo.RecordHeader
	for _, h := range hs {
		if h.Key != name {
			out = append(out, h)
		}
	}
	return out
}

func headerValue(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

func runBinErr(bin string, env []string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func runBin(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	out, err := runBinErr(bin, env, args...)
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", bin, args, err, out)
	}
	return out
}
