package itest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/wire"
)

// foreignCE is a binary-mode CloudEvent as a producer other than onceflow
// writes it (no producer, event-id or seq headers).
func foreignCE(topic, source, id string, seq int64) *kgo.Record {
	h := func(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }
	return &kgo.Record{Topic: topic, Key: []byte(source), Value: fmt.Appendf(nil, `{"id":%q}`, id), Headers: []kgo.RecordHeader{
		h("ce_specversion", "1.0"), h("ce_id", id), h("ce_source", source), h("ce_type", "shop.order.paid"),
		h("ce_time", "2026-01-02T03:04:05Z"), h("ce_sequence", fmt.Sprint(seq)), h("content-type", "application/json"),
	}}
}

// TestConsumerForeignCloudEvents: CloudEvents from a foreign producer are
// applied once each, deduplicated by (source, id) — the same id under two
// sources is two events, the same (source, id) twice is one — and in
// sequence order: seq 2 arriving before 1 is parked until 1 comes.
func TestConsumerForeignCloudEvents(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	topic := testkit.Topic(t, "ce", 1, nil)
	cl := testkit.Client(t)
	produceRecords(t, cl,
		foreignCE(topic, "/shop/eu", "e-2", 2),
		foreignCE(topic, "/shop/eu", "e-2", 2), // redelivered by the producer
		foreignCE(topic, "/shop/us", "e-2", 1), // same id, other source: another event
		foreignCE(topic, "/shop/eu", "e-1", 1),
		foreignCE(topic, "/shop/eu", "e-3", 3),
	)
	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t)})
	eventually(t, 30*time.Second, "four events applied", func() (bool, string) {
		p, d := e.metric("onceflow_consumer_processed_total"), e.metric("onceflow_consumer_duplicates_total")
		return p == 4 && d == 1, fmtState("processed", p, "duplicates", d)
	})
	e.stop(t)
	checkEffects(t, db, map[string]bool{
		wire.ForeignEventID("/shop/eu", "e-1"): true, wire.ForeignEventID("/shop/eu", "e-2"): true,
		wire.ForeignEventID("/shop/eu", "e-3"): true, wire.ForeignEventID("/shop/us", "e-2"): true,
	})
	checkOrdered(t, db)
}

// TestConsumerAvroCloudEvents: records a onceflow encoder wrote in Avro
// (Confluent framing, schema from the registry) as binary CloudEvents are
// decoded by the consumer through the registry into the JSON view its SQL
// handler reads, once each; a consumer without a registry dead-letters them
// as malformed, naming the missing registry.
func TestConsumerAvroCloudEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := consumerDB(t)
	topic := testkit.Topic(t, "avro", 1, nil)
	reg, err := sr.NewClient(sr.URLs(testkit.SchemaRegistryURL(t)))
	if err != nil {
		t.Fatal(err)
	}
	tf := wire.TopicFormat{Format: wire.FormatAvro, CloudEvents: wire.CloudEventsBinary,
		Schema: `{"type":"record","name":"Tick","fields":[{"name":"source","type":"string"},{"name":"seq","type":"long"}]}`}
	if _, err := wire.Register(ctx, reg, topic, tf, wire.CompatBackward); err != nil {
		t.Fatal(err)
	}
	enc, err := wire.NewEncoder(ctx, reg, map[string]wire.TopicFormat{topic: tf})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	want := map[string]bool{}
	var recs []*kgo.Record
	for i := int64(1); i <= n; i++ {
		ev := testEvent(fmt.Sprintf("tick-%d", (i-1)%3), (i-1)/3+1)
		ev.Producer = "db-test"
		rec, err := enc.Record(&ev, topic)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
		want[ev.EventID] = true
	}
	produceRecords(t, testkit.Client(t), recs...)

	bare := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-bare-" + topic, ConsumerName: "bare", Topics: []string{topic}, BatchHandler: sqlHandler(t)})
	eventually(t, 30*time.Second, "records dead-lettered without a registry", func() (bool, string) {
		m := bare.metric("onceflow_consumer_malformed_total")
		return m == n, fmtState("malformed", m)
	})
	bare.stop(t)
	if got := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE consumer = 'bare' AND last_error LIKE '%no schema registry%'`); got != n {
		t.Fatalf("%d dead letters name the missing registry, want %d", got, n)
	}

	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t), SchemaRegistry: reg})
	eventually(t, 30*time.Second, "every avro record applied", func() (bool, string) {
		p := e.metric("onceflow_consumer_processed_total")
		return p == n, fmtState("processed", p)
	})
	e.stop(t)
	checkEffects(t, db, want)
	checkOrdered(t, db)
}
