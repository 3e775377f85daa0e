package itest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	console "github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/testkit"
)

// TestConsoleLagSkipsCommitMarkers: a partition written by Kafka
// transactions (as the relay writes) ends in a commit marker, which takes an
// offset but is no event. Three events in one transaction (offsets 0–2, the
// marker at 3) applied (stored next offset 3): the console's lag is 0, where
// the offset difference says 1. Then an aborted transaction (its event is
// never read) and a committed one of two events: lag 2 (offsets 4–8 hold an
// aborted event, two markers and two events).
func TestConsoleLagSkipsCommitMarkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := consumerDB(t)
	topic := testkit.Topic(t, "lag-markers", 1, nil)
	group := "g-" + topic
	prod := testkit.Client(t, kgo.TransactionalID("lag-"+topic))
	txn := func(commit bool, n int) {
		t.Helper()
		if err := prod.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for range n {
			if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("{}")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := prod.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	txn(true, 3)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.consumer_offsets (group_id, topic, kafka_partition, next_offset) VALUES ($1, $2, 0, 3)`, group, topic); err != nil {
		t.Fatal(err)
	}
	brokers := strings.Split(testkit.KafkaBrokers(t), ",")
	service := func(reader bool) *console.Service {
		t.Helper()
		cfg := console.Config{Group: group, Topics: []string{topic}, Pool: db.Pool, Kafka: kadm.NewClient(testkit.Client(t))}
		if reader {
			cfg.KafkaReader = func(opts ...kgo.Opt) (*kgo.Client, error) {
				return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
			}
		}
		svc, err := console.NewService(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	// lag reads the lag once the partition's end (its last stable offset)
	// has reached want: EndTransaction returns once the coordinator has
	// the decision, and the markers that move the end are written after.
	lag := func(svc *console.Service, want int64) (total int64, end int64) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			r, err := svc.Lag(ctx)
			if err != nil || r.KafkaError != "" || len(r.Partitions) != 1 || r.Partitions[0].EndOffset == nil {
				t.Fatalf("lag: %+v %v", r, err)
			}
			total, end = r.Total, *r.Partitions[0].EndOffset
			if end >= want || time.Now().After(deadline) {
				return total, end
			}
			time.Sleep(20 * time.Millisecond) // polling a condition: the markers' write
		}
	}
	if total, end := lag(service(false), 4); total != 1 || end != 4 {
		t.Fatalf("without a reader: lag %d end %d, want the offset difference 1 at end 4", total, end)
	}
	svc := service(true)
	if total, _ := lag(svc, 4); total != 0 {
		t.Fatalf("caught up: lag %d, want 0", total)
	}
	txn(false, 1)
	txn(true, 2)
	if total, end := lag(svc, 9); total != 2 || end != 9 {
		t.Fatalf("after an aborted and a committed transaction: lag %d end %d, want 2 events at end 9", total, end)
	}
}
