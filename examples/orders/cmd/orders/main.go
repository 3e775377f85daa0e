// Command orders is the example's orders service: it places -count orders,
// each in its own transaction with its "order.placed" event in the outbox,
// and exits. Run again (after a crash), it places only the orders that are
// missing.
//
//	orders -database-url postgres://… -topic orders -count 100
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/examples/orders"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func run() error {
	databaseURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "the orders database (default $DATABASE_URL)")
	topic := flag.String("topic", "orders", "the topic of the order events")
	count := flag.Int("count", 100, "how many orders to place (order-00001 …)")
	interval := flag.Duration("interval", 0, "pause between two orders")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, *databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := orders.Setup(ctx, pool, orders.OrdersSchema); err != nil {
		return err
	}
	placed := 0
	for i := 1; i <= *count; i++ {
		id := fmt.Sprintf("order-%05d", i)
		ok, err := orders.PlaceOrder(ctx, pool, *topic, id, 1+i%5)
		if err != nil {
			return err
		}
		if ok {
			placed++
			if placed%100 == 0 {
				log.InfoContext(ctx, "orders placed", "placed", placed, "last", id)
			}
		}
		if *interval > 0 {
			select {
			case <-time.After(*interval):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	log.InfoContext(ctx, "done", "placed", placed, "orders", *count)
	return nil
}
