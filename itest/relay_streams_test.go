package itest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestRelayStreamSeqs: two aggregates each write 10 events alternating
// between two topics (order events to one, e-mail requests to the other),
// one at a time and in batches, through the real relay: on each topic each
// source's records carry the seqs 1..5 in order, no gap where the other
// topic's events were (I5), so a consumer of one topic has nothing to wait
// for.
func TestRelayStreamSeqs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := newRelayEnv(t, 3)
	emails := testkit.Topic(t, "relay-emails", 3, nil)
	topics := [2]string{e.topic, emails}
	const perSource = 10
	for _, src := range []string{"order-1", "order-2"} {
		var batch []outbox.Message
		for i := range perSource {
			m := outbox.Message{Topic: topics[i%2], Source: src, EventType: "test.event", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}
			if src == "order-2" && i >= 4 { // the last six in one batch
				batch = append(batch, m)
				continue
			}
			if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, m)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		if len(batch) > 0 {
			if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
				_, err := outbox.EnqueueBatch(ctx, tx, batch)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.start("relay", nil, "-holder-id", "streams")
	waitPublished(t, ctx, e, 2*perSource)
	for _, topic := range topics {
		got := publishedPerSource(t, ctx, topic)
		for _, src := range []string{"order-1", "order-2"} {
			if fmt.Sprint(got[src]) != "[1 2 3 4 5]" {
				t.Errorf("%s on %s: seqs %v, want [1 2 3 4 5]", src, topic, got[src])
			}
		}
	}
}
