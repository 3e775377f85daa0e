// Command watermill-forwarder is the Watermill peer of onceflow's relay in
// `make bench`: Watermill's SQL outbox (watermill-sql v4, PostgreSQL) drained
// to Kafka by its forwarder component through watermill-kafka v3, each with
// its default settings except those named below. It is a module of its own so
// that onceflow's go.mod does not carry Watermill and Sarama.
//
//	watermill-forwarder fill    -database-url U -topic T -n N [-txn 1000] [-payload 256] [-sources 256]
//	watermill-forwarder forward -database-url U -brokers B [-batch 100]
//
// fill writes N enveloped messages for Kafka topic T into the SQL outbox
// topic, in transactions of -txn messages, the way an application publishes
// through forwarder.NewPublisher inside its own transaction. forward runs the
// forwarder until SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// outboxTopic is the SQL topic (table watermill_onceflow_bench_outbox) the
// forwarder reads.
const outboxTopic = "onceflow_bench_outbox"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "watermill-forwarder:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("want fill or forward")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	dbURL := fs.String("database-url", "", "PostgreSQL URL")
	brokers := fs.String("brokers", "", "Kafka brokers, comma-separated")
	topic := fs.String("topic", "", "destination Kafka topic (fill)")
	n := fs.Int("n", 0, "messages to write (fill)")
	perTxn := fs.Int("txn", 1000, "messages per transaction (fill)")
	payloadBytes := fs.Int("payload", 256, "payload bytes (fill)")
	sources := fs.Int("sources", 256, "distinct partition keys (fill)")
	batch := fs.Int("batch", 100, "SubscribeBatchSize of the SQL subscriber (forward; Watermill's default is 100)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	logger := watermill.NewSlogLogger(nil)
	schema := wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: *batch}
	switch args[0] {
	case "fill":
		return fill(ctx, pool, schema, logger, *topic, *n, *perTxn, *payloadBytes, *sources)
	case "forward":
		return forward(ctx, pool, schema, logger, strings.Split(*brokers, ","))
	}
	return fmt.Errorf("unknown command %q", args[0])
}

func fill(ctx context.Context, pool *pgxpool.Pool, schema wsql.SchemaAdapter, logger watermill.LoggerAdapter, topic string, n, perTxn, payloadBytes, sources int) error {
	// Create the tables outside the producers' transactions (Watermill
	// forbids initializing the schema inside one).
	sub, err := newSubscriber(pool, schema, logger)
	if err != nil {
		return err
	}
	if err := sub.SubscribeInitialize(outboxTopic); err != nil {
		return fmt.Errorf("initialize schema: %w", err)
	}
	payload := []byte(`{"pad":"` + strings.Repeat("x", max(0, payloadBytes-10)) + `"}`)
	for off := 0; off < n; off += perTxn {
		msgs := make([]*message.Message, 0, perTxn)
		for i := off; i < min(off+perTxn, n); i++ {
			m := message.NewMessage(watermill.NewUUID(), payload)
			m.Metadata.Set("source", fmt.Sprintf("src-%d", i%sources))
			m.Metadata.Set("event-id", fmt.Sprintf("wm-%d", i))
			msgs = append(msgs, m)
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: schema}, logger)
			if err != nil {
				return err
			}
			return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: outboxTopic}).Publish(topic, msgs...)
		})
		if err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	return nil
}

func forward(ctx context.Context, pool *pgxpool.Pool, schema wsql.SchemaAdapter, logger watermill.LoggerAdapter, brokers []string) error {
	sub, err := newSubscriber(pool, schema, logger)
	if err != nil {
		return fmt.Errorf("sql subscriber: %w", err)
	}
	cfg := kafka.DefaultSaramaSyncPublisherConfig()
	// The partitioner keys by the message's partition key, like onceflow's
	// records (keyed by source).
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               brokers,
		Marshaler:             kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) { return m.Metadata.Get("source"), nil }),
		OverwriteSaramaConfig: cfg,
	}, logger)
	if err != nil {
		return fmt.Errorf("kafka publisher: %w", err)
	}
	fwd, err := forwarder.NewForwarder(sub, pub, logger, forwarder.Config{ForwarderTopic: outboxTopic})
	if err != nil {
		return fmt.Errorf("forwarder: %w", err)
	}
	fmt.Fprintln(os.Stderr, "forwarder running")
	err = fwd.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func newSubscriber(pool *pgxpool.Pool, schema wsql.SchemaAdapter, logger watermill.LoggerAdapter) (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		ConsumerGroup:    "onceflow-bench",
		SchemaAdapter:    schema,
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
	}, logger)
}
