package inboxtest_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inboxtest"
)

type OrderPlaced struct {
	OrderID string `json:"order_id"`
}

// newShipper is the handler under test: one shipment per order.
func newShipper() *inbox.Router {
	r := inbox.NewRouter(nil)
	inbox.Route(r, "order.placed", func(ctx context.Context, tx pgx.Tx, ev inbox.TypedEvent[OrderPlaced]) error {
		_, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, ev.Value.OrderID)
		return err
	})
	return r
}

// testShipper is the body of a test in your _test.go:
//
//	func TestShipper(t *testing.T) { testShipper(t) }
func testShipper(t testing.TB) {
	h := inboxtest.New(t, inboxtest.Config{
		DSN:     os.Getenv("DATABASE_URL"), // a role that may create databases
		Handler: newShipper(),
		Setup: func(ctx context.Context, pool *pgxpool.Pool) error {
			_, err := pool.Exec(ctx, `CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
			return err
		},
	})

	// The three redelivery tests, each with an order of its own.
	n := 0
	h.CheckRedelivery(func() envelope.Envelope {
		n++
		id := fmt.Sprintf("order-%d", n)
		return h.Event(id, "order.placed", OrderPlaced{OrderID: id})
	}, func(ctx context.Context, tx pgx.Tx, ev envelope.Envelope) (int, error) {
		var shipments int
		err := tx.QueryRow(ctx, `SELECT count(*) FROM shipments WHERE order_id = $1`, ev.Source).Scan(&shipments)
		return shipments, err
	})

	// Single events: applied, or dead-lettered with a reason.
	placed := h.Event("order-x", "order.placed", OrderPlaced{OrderID: "order-x"})
	refunded := h.Event("order-x", "order.refunded", nil)
	h.Apply(placed, refunded)
	h.AssertApplied(placed)
	h.AssertDeadLettered(refunded, `no handler for event type "order.refunded"`)
}

// Test a handler of your own through the real inbox and guard, against
// your PostgreSQL, without Kafka.
func Example() {
	_ = testShipper // see the file: call it from a Test function
}
