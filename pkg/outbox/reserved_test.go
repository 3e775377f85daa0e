package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestEnqueueRefusesReservedEventID: an event id starting with "malformed:"
// (the prefix of the consumer's keys for records that break the envelope)
// is refused by outbox.Enqueue and, through the outbox table's check, by
// onceflow.enqueue.
func TestEnqueueRefusesReservedEventID(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	db := testkit.NewDB(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = outbox.Enqueue(ctx, tx, outbox.Message{Topic: "t", Source: "s", EventType: "x.y", EventID: "malformed:t:0:1", Payload: []byte(`{}`)})
	if err == nil || !strings.Contains(err.Error(), "malformed:") {
		t.Fatalf("Enqueue: %v", err)
	}
	_, err = db.Pool.Exec(ctx, `SELECT onceflow.enqueue('t', 's', 'x.y', '{}'::jsonb, 'malformed:t:0:1')`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" || pe.ConstraintName != "outbox_event_id_not_reserved" {
		t.Fatalf("onceflow.enqueue: %v", err)
	}
}
