// Command shipper is the example's shipping service: an embedded onceflow
// consumer (pkg/inbox) whose typed router writes one shipment per
// "order.placed" event into the shipping database, until SIGINT or SIGTERM.
//
//	shipper -database-url postgres://… -kafka-brokers localhost:9092 -topic orders
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/examples/orders"
	"github.com/onceflow/onceflow/pkg/inbox"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "shipper:", err)
		os.Exit(1)
	}
}

func run() error {
	databaseURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "the shipping database (default $DATABASE_URL)")
	brokers := flag.String("kafka-brokers", os.Getenv("KAFKA_BROKERS"), "comma-separated seed brokers (default $KAFKA_BROKERS)")
	topic := flag.String("topic", "orders", "the topic of the order events")
	group := flag.String("group", "shipper", "the Kafka consumer group")
	instanceID := flag.String("instance-id", "", "static group membership id: a restarted replica takes its partitions back at once")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, *databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := orders.Setup(ctx, pool, orders.ShipmentsSchema); err != nil {
		return err
	}
	c, err := inbox.New(inbox.Config{
		Group:      *group,
		Handler:    orders.NewRouter(),
		InstanceID: *instanceID,
		KafkaOpts:  []kgo.Opt{kgo.SeedBrokers(strings.Split(*brokers, ",")...)},
		Logger:     log,
		OnDeadLetter: func(ctx context.Context, d inbox.DeadLettered) {
			log.ErrorContext(ctx, "shipment not made: event dead-lettered", "event_id", d.EventID, "reason", d.Reason)
		},
		Pool:   pool,
		Topics: []string{*topic},
	})
	if err != nil {
		return err
	}
	log.InfoContext(ctx, "shipper running", "topic", *topic, "group", *group)
	return c.Run(ctx)
}
