package inbox_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
)

type orderPlaced struct {
	OrderID string `json:"order_id"`
	Items   int    `json:"items"`
}

// A Router sends each event to the typed handler of its type, decoded (JSON
// by default). Use it as Config.Handler; an event of an unknown type, or
// one that does not decode, is dead-lettered at once with a reason naming
// what is wrong. (Here the router is called directly, without a
// transaction, to show what handlers see.)
func ExampleRouter() {
	r := inbox.NewRouter(nil)
	inbox.Route(r, "order.placed", func(ctx context.Context, tx pgx.Tx, ev inbox.TypedEvent[orderPlaced]) error {
		// Write through tx: it commits with the event's inbox row.
		fmt.Printf("ship %s (%d items), seq %d\n", ev.Value.OrderID, ev.Value.Items, ev.Seq)
		return nil
	})
	ctx := context.Background()
	for _, e := range []envelope.Envelope{
		{EventID: "e1", Source: "order-7", Seq: 1, EventType: "order.placed", Payload: []byte(`{"order_id":"order-7","items":2}`)},
		{EventID: "e2", Source: "order-7", Seq: 2, EventType: "order.refunded", Payload: []byte(`{}`)},
		{EventID: "e3", Source: "order-8", Seq: 1, EventType: "order.placed", Payload: []byte(`{"order_id":"order-8","items":"two"}`)},
	} {
		if err := r.Handle(ctx, nil, inbox.Event{Envelope: e}); err != nil {
			fmt.Println("dead letter:", err)
		}
	}
	// Output:
	// ship order-7 (2 items), seq 1
	// dead letter: no handler for event type "order.refunded" (the router handles: order.placed)
	// dead letter: decode the payload of event type "order.placed" into inbox_test.orderPlaced: json: cannot unmarshal string into Go struct field orderPlaced.items of type int
}
