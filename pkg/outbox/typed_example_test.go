package outbox_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// Enqueue a Go value as the event's JSON payload, in the transaction of
// the business write. outbox.Encode does the same with another codec, for
// a Writer or a batch.
func ExampleEnqueueValue() {
	type OrderPlaced struct {
		OrderID string `json:"order_id"`
		Items   int    `json:"items"`
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, items) VALUES ('order-7', 2)`); err != nil {
			return err
		}
		_, err := outbox.EnqueueValue(ctx, tx, outbox.Message{
			Topic:     "orders",
			Source:    "order-7",
			EventType: "order.placed",
		}, OrderPlaced{OrderID: "order-7", Items: 2})
		return err
	})
	if err != nil {
		fmt.Println(err)
	}
}
