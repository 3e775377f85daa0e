package orders_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/examples/orders"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inboxtest"
	"github.com/onceflow/onceflow/pkg/migrate/migratetest"
)

// dsn is the test PostgreSQL: in your own service's tests, a URL of your
// own, e.g. os.Getenv("DATABASE_URL").
func dsn(t *testing.T) string { return testkit.DatabaseURL(t) }

func shipper(t *testing.T) *inboxtest.Harness {
	return inboxtest.New(t, inboxtest.Config{
		DSN:     dsn(t),
		Handler: orders.NewRouter(),
		Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := pool.Exec(ctx, orders.ShipmentsSchema)
			return err
		},
	})
}

// shipments counts the shipments of the order an event names.
func shipments(ctx context.Context, tx pgx.Tx, ev envelope.Envelope) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM public.shipments WHERE order_id = $1`, ev.Source).Scan(&n)
	return n, err
}

// TestShipperRedelivery: the shipping handler passes the three redelivery
// tests (twice, a crash before the commit, two consumers racing).
func TestShipperRedelivery(t *testing.T) {
	t.Parallel()
	h := shipper(t)
	n := 0
	h.CheckRedelivery(func() envelope.Envelope {
		n++
		id := fmt.Sprintf("order-%d", n)
		return h.Event(id, orders.EventOrderPlaced, orders.OrderPlaced{OrderID: id, Items: 2})
	}, shipments)
}

// TestShipperDeadLetters: an event the shipper cannot apply is
// dead-lettered with a reason naming what is wrong; the next order ships.
func TestShipperDeadLetters(t *testing.T) {
	t.Parallel()
	h := shipper(t)
	refunded := h.Event("order-1", "order.refunded", orders.OrderPlaced{OrderID: "order-1"})
	noID := h.Event("order-2", orders.EventOrderPlaced, orders.OrderPlaced{Items: 1})
	badItems := h.Event("order-3", orders.EventOrderPlaced, []byte(`{"order_id":"order-3","items":"two"}`))
	ok := h.Event("order-4", orders.EventOrderPlaced, orders.OrderPlaced{OrderID: "order-4", Items: 1})
	h.Apply(refunded, noID, badItems, ok)
	h.AssertDeadLettered(refunded, `no handler for event type "order.refunded" (the router handles: order.placed)`)
	h.AssertDeadLettered(noID, "order.placed without order_id")
	h.AssertDeadLettered(badItems, "Go struct field OrderPlaced.items of type int")
	h.AssertApplied(ok)
}

// TestPlaceOrder: the order and its event commit together; placing it again
// does nothing.
func TestPlaceOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := migratetest.NewDatabase(t, dsn(t))
	if err := orders.Setup(ctx, db.Pool, orders.OrdersSchema); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		placed, err := orders.PlaceOrder(ctx, db.Pool, "orders", "order-1", 3)
		if err != nil || placed != want {
			t.Fatalf("PlaceOrder #%d: placed %v, %v; want %v", i+1, placed, err, want)
		}
	}
	var payload, eventType string
	if err := db.Pool.QueryRow(ctx, `SELECT convert_from(payload, 'UTF8'), event_type FROM onceflow.outbox`).Scan(&payload, &eventType); err != nil {
		t.Fatal(err)
	}
	if payload != `{"order_id":"order-1","items":3}` || eventType != orders.EventOrderPlaced {
		t.Fatalf("outbox row: %s %s", eventType, payload)
	}
}
