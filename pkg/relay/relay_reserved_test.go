package relay_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/relay"
)

// TestRelayReservesCheckpointTopic: the relay registers its checkpoint
// topic in onceflow.reserved_topics at start, after which the database
// refuses events for it (SQLSTATE 42501); a row for it that got in before
// (here: inserted with the guard disabled) is set aside as invalid_topic,
// never published to the checkpoint topic, while other sources go on.
func TestRelayReservesCheckpointTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	topic := testkit.Topic(t, "unit", 1, nil)
	ckpt := testkit.Topic(t, "ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	rb := startRelay(t, topic, func(c *relay.Config) { c.CheckpointTopic = ckpt })
	waitUntil(t, "the checkpoint topic reserved", func() bool {
		var n int
		_ = rb.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.reserved_topics WHERE topic = $1`, ckpt).Scan(&n)
		return n == 1
	})
	_, err := rb.enqueue(t, outbox.Writer{}, outbox.Message{Topic: ckpt, Source: "forger", EventType: "x", Payload: []byte(`{}`)})
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42501" {
		t.Fatalf("enqueue to the checkpoint topic: %v; want refused (42501)", err)
	}
	// A row from before the reservation.
	for _, q := range []string{
		`ALTER TABLE onceflow.outbox DISABLE TRIGGER outbox_guard`,
		`INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('forged-1', '` + ckpt + `', 'forger', 1, 'x', '\x7b7d')`,
		`ALTER TABLE onceflow.outbox ENABLE TRIGGER outbox_guard`,
	} {
		if _, err := rb.db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := rb.enqueue(t, outbox.Writer{}, outbox.Message{Topic: topic, Source: "good", EventType: "x", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the forged row set aside and the good one published", func() bool {
		var setAside, published bool
		_ = rb.db.Pool.QueryRow(ctx, `SELECT
			EXISTS (SELECT 1 FROM onceflow.outbox_set_aside WHERE reason = 'invalid_topic' AND source = 'forger' AND resolved_at IS NULL AND error LIKE '%reserved%'),
			EXISTS (SELECT 1 FROM onceflow.outbox WHERE source = 'good' AND id NOT IN (SELECT id FROM onceflow.outbox_pending))`).Scan(&setAside, &published)
		return setAside && published
	})
}
