package itest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// recreateTopic deletes topic and creates it again with the same name and
// partitions, and returns the new topic ID (as Kafka's tools print it).
func recreateTopic(t *testing.T, topic string, partitions int32) string {
	t.Helper()
	adm := kadm.NewClient(testkit.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old, err := adm.ListTopics(ctx, topic)
	if err != nil || old[topic].Err != nil {
		t.Fatalf("describe %s: %v %v", topic, err, old[topic].Err)
	}
	if _, err := adm.DeleteTopics(ctx, topic); err != nil {
		t.Fatalf("delete %s: %v", topic, err)
	}
	created := false
	for {
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		if !created {
			resp, err := adm.CreateTopic(actx, partitions, 1, nil, topic)
			created = err == nil && resp.Err == nil
		}
		if created {
			md, err := adm.ListTopics(actx, topic)
			if err == nil && md[topic].Err == nil && md[topic].ID != old[topic].ID {
				acancel()
				return strings.TrimRight(strings.NewReplacer("+", "-", "/", "_").Replace(md[topic].ID.String()), "=")
			}
		}
		acancel()
		if ctx.Err() != nil {
			t.Fatalf("recreate %s: %v", topic, ctx.Err())
		}
		time.Sleep(100 * time.Millisecond) // deletion and metadata are asynchronous
	}
}

// TestConsumerTopicRecreated: a topic is deleted and recreated under a
// running consumer group whose next offsets are stored in Postgres. The
// consumer notices the new instance, subscribes to it again, ignores the
// stored offsets of the old instance (counted, WARN) and applies every new
// event exactly once; the stored offsets then name the new topic ID.
func TestConsumerTopicRecreated(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	const parts, before, after = 2, 200, 200
	topic := testkit.Topic(t, "recreate", parts, nil)
	var logs logBuf
	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t),
		BatchMaxRecords: 50, Logger: logs.logger(), Ordering: inbox.OrderArrival})
	want := map[string]bool{}
	var evs []envelope.Envelope
	for i := range before {
		ev := testEvent(fmt.Sprintf("old-%d", i%10), int64(i/10+1))
		evs, want[ev.EventID] = append(evs, ev), true
	}
	produce(t, testkit.Client(t), topic, evs...)
	eventually(t, 60*time.Second, "the old topic's events applied", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM public.effects`)
		return n == before, fmtState(n, " applied")
	})
	eventually(t, 30*time.Second, "next offsets stored for both partitions", func() (bool, string) {
		n := count(t, db, `SELECT coalesce(sum(next_offset), 0) FROM onceflow.consumer_offsets WHERE topic = $1`, topic)
		return n == before, fmtState("stored offsets sum ", n)
	})

	newID := recreateTopic(t, topic, parts)
	evs = nil
	for i := range after {
		ev := testEvent(fmt.Sprintf("new-%d", i%10), int64(i/10+1))
		evs, want[ev.EventID] = append(evs, ev), true
	}
	produce(t, testkit.Client(t), topic, evs...) // a new client: the old one stays on the deleted instance
	defer func() {
		if t.Failed() {
			for _, l := range logs.lines(`"level"`) {
				t.Log(l)
			}
		}
	}()
	eventually(t, 90*time.Second, "the new topic's events applied", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM public.effects WHERE event_id LIKE 'new-%'`)
		return n == after, fmtState(n, " of ", after, " new events applied")
	})
	e.stop(t)
	checkEffects(t, db, want)
	if n := count(t, db, `SELECT count(*) FROM onceflow.consumer_offsets WHERE topic = $1 AND topic_id = $2`, topic, newID); n != parts {
		t.Errorf("%d stored offsets name the new topic ID %s, want %d", n, newID, parts)
	}
	ignored := e.metric("onceflow_consumer_stored_offsets_ignored_total")
	if ignored < 1 || len(logs.lines(`"msg":"stored offset ignored`)) == 0 {
		t.Errorf("stored offsets of the old topic: %v ignored, WARN lines %d", ignored, len(logs.lines(`"msg":"stored offset ignored`)))
	}
	t.Logf("%d events before, %d after the recreation, each applied once; %v stored offsets ignored, %v recreations seen",
		before, after, ignored, e.metric("onceflow_consumer_topics_recreated_total"))
}
