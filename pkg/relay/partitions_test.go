package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// The relay publishes a source's rows in seq order across the outbox's
// partitions (migration 034): from the legacy partition into the first id
// range, and on through ranges of ten ids.
func TestRelayPublishesAcrossPartitions(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	topic := testkit.Topic(t, "unit", 1, nil)
	rb := startRelay(t, topic)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := rb.db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var bound int64
	if err := rb.db.Pool.QueryRow(ctx, `SELECT to_id FROM onceflow.outbox_partitions WHERE relname = 'outbox_legacy'`).Scan(&bound); err != nil {
		t.Fatal(err)
	}
	n := 0
	enqueue := func(k int) {
		t.Helper()
		for range k {
			n++
			m := outbox.Message{Topic: topic, Source: "s", EventType: "x", Payload: []byte(`{}`), EventID: fmt.Sprintf("ev-%03d", n)}
			if _, err := rb.enqueue(t, outbox.Writer{}, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound-10)
	enqueue(20)
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+1000000-10)
	exec(`SELECT onceflow.outbox_ensure_partitions(10)`)
	enqueue(30)
	var places int
	if err := rb.db.Pool.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM onceflow.outbox`).Scan(&places); err != nil {
		t.Fatal(err)
	}
	if places < 4 {
		t.Fatalf("the rows lie in %d partitions, want 4 at least", places)
	}

	cons := testkit.ReadCommittedClient(t, topic)
	var got []envelope.Envelope
	cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	for len(got) < n {
		fs := cons.PollFetches(cctx)
		if cctx.Err() != nil {
			t.Fatalf("saw %d of %d records; relay logs:\n%s", len(got), n, rb.logs)
		}
		fs.EachRecord(func(r *kgo.Record) {
			env, err := envelope.Decode(r, 0)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			got = append(got, env)
		})
	}
	for i, e := range got {
		if want := fmt.Sprintf("ev-%03d", i+1); e.EventID != want || e.Seq != int64(i+1) {
			t.Fatalf("record %d: %s seq %d, want %s seq %d", i, e.EventID, e.Seq, want, i+1)
		}
	}
}
