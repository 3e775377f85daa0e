package outboxsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxsql"
)

// Enqueue an event in a database/sql transaction, with the business write.
func ExampleEnqueueValue() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	if _, err := tx.ExecContext(ctx, `UPDATE orders SET state = 'paid' WHERE id = $1`, "order-7"); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := outboxsql.EnqueueValue(ctx, tx, outbox.Message{Topic: "orders", Source: "order-7", EventType: "order.paid"},
		map[string]any{"order_id": "order-7", "cents": 1250}); err != nil {
		fmt.Println(err)
		return
	}
	if err := tx.Commit(); err != nil {
		fmt.Println(err)
	}
}
