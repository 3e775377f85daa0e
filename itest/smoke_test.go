package itest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestSmokeKafkaTransactions checks the broker the way everything else relies
// on it: a committed transaction is visible to a read_committed reader and an
// aborted one never is.
func TestSmokeKafkaTransactions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := testkit.Topic(t, "smoke", 1, nil)

	prod := testkit.Client(t,
		kgo.TransactionalID("smoke-"+topic),
		kgo.DefaultProduceTopic(topic),
	)
	produceTxn := func(value string, commit bool) {
		t.Helper()
		if err := prod.BeginTransaction(); err != nil {
			t.Fatalf("begin: %v", err)
		}
		if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(value)}).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", value, err)
		}
		if err := prod.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatalf("end transaction: %v", err)
		}
	}
	produceTxn("aborted-1", false)
	produceTxn("committed", true)
	produceTxn("aborted-2", false)
	// A committed marker after the aborted one moves the last stable offset
	// past it, so the reader below has seen everything once it sees "end".
	produceTxn("end", true)

	cons := testkit.ReadCommittedClient(t, topic)
	var got []string
	for len(got) == 0 || got[len(got)-1] != "end" {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read_committed consumer saw %v before timing out", got)
		}
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("fetch: %v", err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if len(got) != 2 || got[0] != "committed" {
		t.Fatalf("read_committed saw %q, want [committed end]", got)
	}
}

// TestSmokeSchemaRoundTrip writes a row through the first migration's
// schema and reads it back.
func TestSmokeSchemaRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.NewDB(t)
	var id int64
	err := db.Pool.QueryRow(ctx, `
		INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload)
		VALUES ('evt-1', 'orders', 'order-88', 1, 'order.created', '{"total":42}')
		RETURNING id`).Scan(&id)
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	var source, payload string
	var seq int64
	if err := db.Pool.QueryRow(ctx, `SELECT source, seq, convert_from(payload, 'UTF8') FROM onceflow.outbox WHERE id = $1`, id).
		Scan(&source, &seq, &payload); err != nil {
		t.Fatalf("select: %v", err)
	}
	if source != "order-88" || seq != 1 || payload != `{"total":42}` {
		t.Fatalf("round trip gave (%q, %d, %q)", source, seq, payload)
	}
}
