// Package orders is a small service built on onceflow as a library: an
// orders service places an order and enqueues an "order.placed" event in
// the same PostgreSQL transaction (PlaceOrder, outbox.EnqueueValue); the
// relay binary publishes the outbox to Kafka; a shipping service consumes
// the topic with a typed router (NewRouter) and writes one shipment per
// order, exactly once, in its own database.
//
// The commands cmd/orders and cmd/shipper run the two sides; orders_test.go
// tests the handler with package inboxtest, and e2e_test.go runs the whole
// service with the real relay, killing processes in the middle. See
// examples/README.md.
package orders

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/migrate"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// EventOrderPlaced is the event type of OrderPlaced.
const EventOrderPlaced = "order.placed"

// OrderPlaced is the payload of an "order.placed" event.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
	Items   int    `json:"items"`
}

// OrdersSchema is the orders service's own table, beside onceflow's outbox.
const OrdersSchema = `CREATE TABLE IF NOT EXISTS public.orders (
    id text PRIMARY KEY,
    items integer NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now()
)`

// ShipmentsSchema is the shipping service's table, beside onceflow's inbox.
// It has no unique key on order_id on purpose: exactly one shipment per
// order is the inbox's doing, and a duplicate would show as a second row.
const ShipmentsSchema = `CREATE TABLE IF NOT EXISTS public.shipments (
    id bigserial PRIMARY KEY,
    order_id text NOT NULL,
    items integer NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset bigint NOT NULL
)`

// Setup migrates onceflow's schema (pkg/migrate, safe to run from every
// replica at once) and creates the service's table.
func Setup(ctx context.Context, pool *pgxpool.Pool, table string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, _, err := migrate.Up(ctx, conn.Conn()); err != nil {
		return fmt.Errorf("migrate onceflow: %w", err)
	}
	if _, err := conn.Exec(ctx, table); err != nil {
		return fmt.Errorf("create table: %w", err)
	}
	return nil
}

// PlaceOrder records order id and enqueues its OrderPlaced event on topic
// in one transaction: both commit, or neither. Placing an order that exists
// does nothing (placed reports false), so a producer restarted after a
// crash can place the same orders again.
func PlaceOrder(ctx context.Context, pool *pgxpool.Pool, topic, id string, items int) (placed bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO public.orders (id, items) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`, id, items)
		if err != nil {
			return err
		}
		if placed = tag.RowsAffected() == 1; !placed {
			return nil
		}
		_, err = outbox.EnqueueValue(ctx, tx, outbox.Message{
			Topic:     topic,
			Source:    id, // the order: its events are ordered among themselves
			EventType: EventOrderPlaced,
			EventID:   "orders:" + id + ":placed", // a natural key
		}, OrderPlaced{OrderID: id, Items: items})
		return err
	})
	if outbox.IsRetryable(err) {
		return false, fmt.Errorf("place order %s (retry it): %w", id, err)
	}
	if errors.Is(err, outbox.ErrDuplicateEventID) {
		return false, nil
	}
	return placed, err
}

// NewRouter is the shipping service's handler: one shipment per
// OrderPlaced, written in the inbox transaction it is given. Other event
// types are dead-lettered, naming the type.
func NewRouter() *inbox.Router {
	r := inbox.NewRouter(nil)
	inbox.Route(r, EventOrderPlaced, func(ctx context.Context, tx pgx.Tx, ev inbox.TypedEvent[OrderPlaced]) error {
		if ev.Value.OrderID == "" {
			return inbox.Permanent(errors.New("order.placed without order_id"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO public.shipments (order_id, items, kafka_partition, kafka_offset) VALUES ($1, $2, $3, $4)`,
			ev.Value.OrderID, ev.Value.Items, ev.Partition, ev.Offset)
		return err
	})
	return r
}
