package outbox_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// Enqueue an event in the same transaction as the business write.
func ExampleEnqueue() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET state = 'refunded' WHERE id = 88`); err != nil {
			return err
		}
		res, err := outbox.Enqueue(ctx, tx, outbox.Message{
			Topic:     "billing.events",
			Source:    "order-88", // the narrowest unit whose order matters
			EventType: "refund_issued",
			EventID:   "billing:order-88:refund_issued", // optional natural key
			Payload:   []byte(`{"order":88,"amount":"12.50"}`),
		})
		if err != nil {
			return err
		}
		fmt.Println("enqueued", res.EventID, "seq", res.Seq)
		return nil
	})
	if outbox.IsRetryable(err) {
		// 40P01/40001: run the whole transaction again.
		return
	}
}
