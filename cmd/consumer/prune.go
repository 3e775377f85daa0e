package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/retention"
)

func loadRetention(path string) (*retention.Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return retention.Parse(b)
}

// runPrune is `consumer prune`: one pass of retention.Prune.
func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer prune", flag.ContinueOnError)
	var (
		db        pgconn.Config
		consumer  string
		file      string
		batchSize int
		pause     time.Duration
	)
	db.RegisterFlags(fs)
	fs.StringVar(&consumer, "consumer-name", inbox.DefaultConsumerName, "logical consumer whose inbox rows and effects are pruned (other consumers' are never touched)")
	fs.StringVar(&file, "retention-file", "", "JSON file of retention classes and sources' redelivery horizons (required)")
	fs.IntVar(&batchSize, "batch-size", 500, "most rows one DELETE removes")
	fs.DurationVar(&pause, "pause", 20*time.Millisecond, "wait between batches")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usage("consumer prune: unexpected argument %q", fs.Arg(0))
	}
	if err := db.Validate(); err != nil {
		return &usageError{Err: err}
	}
	if consumer == "" {
		return usage("-consumer-name (ONCEFLOW_CONSUMER_NAME) must not be empty")
	}
	if file == "" {
		return usage("-retention-file (ONCEFLOW_RETENTION_FILE) is required")
	}
	if batchSize < 1 {
		return usage("-batch-size (ONCEFLOW_BATCH_SIZE) must be at least 1, got %d", batchSize)
	}
	r, err := loadRetention(file)
	if err != nil {
		return usage("-retention-file (ONCEFLOW_RETENTION_FILE): %v", err)
	}
	pool, err := db.Pool(ctx, "onceflow-consumer-prune")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	st, err := retention.Prune(ctx, pool, r, retention.Options{BatchSize: batchSize, Consumer: consumer, Pause: pause})
	if err != nil {
		return err
	}
	if st.Skipped {
		fmt.Fprintln(stdout, "skipped: another replica is pruning")
		return nil
	}
	fmt.Fprintf(stdout, "pruned inbox %d, effects %d, outbox %d, admin_audit %d, outbox_set_aside %d\n",
		st.Inbox, st.Effects, st.Outbox, st.AdminAudit, st.SetAside)
	return nil
}
