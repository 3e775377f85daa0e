package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// Embedding the consumer engine in your own program: a Go handler upserts a
// projection row in the inbox transaction, with the monotonic guard
// "WHERE seq < EXCLUDED.seq" so that an older event never overwrites a newer
// state. The consumer logs to slog.Default() (Logger unset), its metrics go
// to the registry passed as Registerer, and the On* callbacks tell the
// program of every gap given up, dead letter and late event once it is
// committed.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env := exampleEnv() // database, brokers and a fresh topic for this example

	pool, err := pgxpool.New(ctx, env.databaseURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.order_totals (order_id text PRIMARY KEY, total numeric, seq bigint)`); err != nil {
		panic(err)
	}

	applied := make(chan inbox.Event, 1)
	handler := inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev inbox.Event) error {
		_, err := tx.Exec(ctx, `
			INSERT INTO public.order_totals (order_id, total, seq)
			VALUES ($1, ($2::jsonb->>'total')::numeric, $3)
			ON CONFLICT (order_id) DO UPDATE SET total = EXCLUDED.total, seq = EXCLUDED.seq
			WHERE order_totals.seq < EXCLUDED.seq`,
			ev.Source, string(ev.Payload), ev.Seq)
		if err == nil {
			applied <- ev
		}
		return err
	})

	// Your program's registry; prometheus.DefaultRegisterer serves the
	// metrics with the rest of the program's on promhttp.Handler().
	reg := prometheus.NewRegistry()
	c, err := inbox.New(inbox.Config{
		Group:     "example-" + env.topic,
		Handler:   handler,
		KafkaOpts: []kgo.Opt{kgo.SeedBrokers(env.brokers...)},
		// Callbacks run after the commit on the consumer's goroutines: keep
		// them quick (hand paging or HTTP calls to a goroutine of your own).
		OnDeadLetter: func(ctx context.Context, d inbox.DeadLettered) {
			slog.ErrorContext(ctx, "alert: event dead-lettered", "event_id", d.EventID, "reason", d.Reason)
		},
		OnGapGivenUp: func(ctx context.Context, g inbox.GapGivenUp) {
			slog.ErrorContext(ctx, "alert: events lost", "stream", g.Stream.String(), "from_seq", g.From, "to_seq", g.To)
		},
		OnLate: func(ctx context.Context, l inbox.LateEvent) {
			slog.WarnContext(ctx, "late event", "event_id", l.EventID, "held", l.Held)
		},
		Pool:       pool,
		Registerer: reg,
		Topics:     []string{env.topic},
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	// An upstream service published this (normally through the relay).
	ev := envelope.Envelope{EventID: "evt-1", Source: "order-88", Seq: 1, EventType: "order.placed", Payload: []byte(`{"total": 42}`)}
	producer, err := kgo.NewClient(kgo.SeedBrokers(env.brokers...))
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	if err := producer.ProduceSync(ctx, ev.Record(env.topic)).FirstErr(); err != nil {
		panic(err)
	}

	got := <-applied
	stop() // drain: finish the in-flight batch, commit, leave the group
	<-done // Run returns once drained
	var total string
	if err := pool.QueryRow(ctx, `SELECT total::text FROM public.order_totals WHERE order_id = 'order-88'`).Scan(&total); err != nil {
		panic(err)
	}
	fmt.Println(got.EventID, got.Source, got.Seq, total)
	fmt.Println("processed:", processedTotal(reg))
	// Output:
	// evt-1 order-88 1 42
	// processed: 1
}

// processedTotal reads onceflow_consumer_processed_total from reg.
func processedTotal(reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "onceflow_consumer_processed_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

type exampleEnvironment struct {
	databaseURL string
	brokers     []string
	topic       string
}

// exampleEnv comes from TestMain, which provides a migrated database and a
// topic; in your program these are your own settings.
func exampleEnv() exampleEnvironment {
	return exampleEnvironment{
		databaseURL: os.Getenv("INBOX_EXAMPLE_DATABASE_URL"),
		brokers:     strings.Split(os.Getenv("INBOX_EXAMPLE_BROKERS"), ","),
		topic:       os.Getenv("INBOX_EXAMPLE_TOPIC"),
	}
}
