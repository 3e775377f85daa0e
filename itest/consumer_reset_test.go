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

// dbSnapshot is every inbox row and side effect, for before/after
// comparisons.
func dbSnapshot(t testing.TB, db *testkit.DB) string {
	t.Helper()
	var s string
	err := db.Pool.QueryRow(context.Background(), `
		SELECT coalesce((SELECT string_agg(format('%s|%s|%s|%s|%s', event_id, status, attempts, kafka_offset, processed_at), ',' ORDER BY event_id) FROM onceflow.inbox), '')
		    || '#' ||
		    coalesce((SELECT string_agg(format('%s|%s', event_id, n), ',' ORDER BY event_id) FROM public.effects), '')`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// resetGroupToEarliest sets the (empty) group's committed offsets to 0.
func resetGroupToEarliest(t *testing.T, group, topic string, partitions int32) {
	t.Helper()
	adm := kadm.NewClient(testkit.Client(t))
	var os kadm.Offsets
	for p := range partitions {
		os.Add(kadm.Offset{Topic: topic, Partition: p, At: 0, LeaderEpoch: -1})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CommitOffsets(ctx, group, os)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("reset group offsets: %v", err)
	}
}

// TestConsumerOffsetsReset: after everything was applied, the group's Kafka
// offsets are reset to the earliest. (1) With the next offsets still in
// Postgres the consumer seeks past what it applied: nothing is fetched
// again. (2) With Postgres' offsets deleted too, every record is consumed
// again: all are duplicates, and the database is unchanged.
func TestConsumerOffsetsReset(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	const parts = 3
	topic := testkit.Topic(t, "reset", parts, nil)
	group := "g-" + topic
	cl := testkit.Client(t)
	want := map[string]bool{}
	var evs []envelope.Envelope
	for i := range 300 {
		ev := testEvent(fmt.Sprintf("acct-%d", i%17), int64(i/17+1))
		evs = append(evs, ev)
		want[ev.EventID] = true
	}
	produce(t, cl, topic, evs...)
	cfg := inbox.Config{Pool: db.Pool, Group: group, Topics: []string{topic}, BatchHandler: sqlHandler(t), BatchMaxRecords: 37}

	e := startEngine(t, cfg)
	eventually(t, 30*time.Second, "all applied", func() (bool, string) {
		p := e.metric("onceflow_consumer_processed_total")
		return p == 300, fmtState("processed ", p)
	})
	e.stop(t)
	checkEffects(t, db, want)

	// (1) Kafka reset only: Postgres' offsets win.
	resetGroupToEarliest(t, group, topic, parts)
	sentinel := testEvent("sentinel", 1)
	produce(t, cl, topic, sentinel)
	want[sentinel.EventID] = true
	e = startEngine(t, cfg)
	eventually(t, 30*time.Second, "the sentinel applied", func() (bool, string) {
		p := e.metric("onceflow_consumer_processed_total")
		return p == 1, fmtState("processed ", p)
	})
	e.stop(t)
	if d := e.metric("onceflow_consumer_duplicates_total"); d != 0 {
		t.Fatalf("with offsets in Postgres, %v records were fetched again", d)
	}
	checkEffects(t, db, want)
	before := dbSnapshot(t, db)

	// (1b) Rows without a topic ID (written before IDs were stored) are
	// never used for a seek: with Kafka reset too, everything is read again
	// as duplicates. (The next batch that applies something writes the ID.)
	if _, err := db.Pool.Exec(context.Background(), `UPDATE onceflow.consumer_offsets SET topic_id = NULL WHERE group_id = $1`, group); err != nil {
		t.Fatal(err)
	}
	resetGroupToEarliest(t, group, topic, parts)
	e = startEngine(t, cfg)
	eventually(t, 30*time.Second, "everything re-read as duplicates", func() (bool, string) {
		d := e.metric("onceflow_consumer_duplicates_total")
		return d == 301, fmtState("duplicates ", d)
	})
	e.stop(t)
	if got := e.metric("onceflow_consumer_stored_offsets_ignored_total"); got != parts {
		t.Fatalf("stored offsets ignored %v, want %d (reason no_topic_id)", got, parts)
	}
	if p := e.metric("onceflow_consumer_processed_total"); p != 0 {
		t.Fatalf("re-reading applied %v events", p)
	}
	if after := dbSnapshot(t, db); after != before {
		t.Fatalf("database changed by re-reading:\nbefore %s\nafter  %s", trunc(before), trunc(after))
	}

	// (2) Both reset: everything is re-consumed, nothing changes.
	resetGroupToEarliest(t, group, topic, parts)
	if _, err := db.Pool.Exec(context.Background(), `DELETE FROM onceflow.consumer_offsets WHERE group_id = $1`, group); err != nil {
		t.Fatal(err)
	}
	e = startEngine(t, cfg)
	eventually(t, 30*time.Second, "everything re-consumed as duplicates", func() (bool, string) {
		d := e.metric("onceflow_consumer_duplicates_total")
		return d == 301, fmtState("duplicates ", d)
	})
	e.stop(t)
	if p := e.metric("onceflow_consumer_processed_total"); p != 0 {
		t.Fatalf("re-consumption applied %v events", p)
	}
	if after := dbSnapshot(t, db); after != before {
		t.Fatalf("database changed by re-consumption:\nbefore %s\nafter  %s", trunc(before), trunc(after))
	}
}

func trunc(s string) string {
	if len(s) > 400 {
		return s[:400] + "…"
	}
	return strings.TrimSpace(s)
}
