package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/onceflow/onceflow/internal/cli"
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

// pruneFlags is the flag of each retention.Options field `consumer prune`
// sets.
var pruneFlags = cli.Fields{"BatchSize": "batch-size", "Consumer": "consumer-name", "Pause": "pause"}

// runPrune is `consumer prune`: one pass of retention.Prune.
func runPrune(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer prune", flag.ContinueOnError)
	var (
		db   pgconn.Config
		file string
		o    retention.Options
	)
	db.RegisterFlags(fs)
	fs.StringVar(&o.Consumer, "consumer-name", inbox.DefaultConsumerName, consumerNameHelp)
	fs.StringVar(&file, "retention-file", "", retentionFileHelp)
	fs.IntVar(&o.BatchSize, "batch-size", retention.DefaultBatchSize, "most rows one DELETE removes")
	fs.DurationVar(&o.Pause, "pause", retention.DefaultPause, "wait between batches")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("consumer prune: unexpected argument %q", fs.Arg(0))
	}
	if err := db.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	if err := o.Validate(); err != nil {
		var ce *retention.ConfigError
		if errors.As(err, &ce) {
			return pruneFlags.Error("retention options", ce.Field, ce.Reason)
		}
		return &cli.UsageError{Err: err}
	}
	if file == "" {
		return cli.Usagef("%s is required", cli.Named("retention-file"))
	}
	r, err := loadRetention(file)
	if err != nil {
		return cli.Usagef("%s: %v", cli.Named("retention-file"), err)
	}
	pool, err := db.Pool(ctx, "onceflow-consumer-prune")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	st, err := retention.Prune(ctx, pool, r, o)
	if err != nil {
		return err
	}
	if st.Skipped {
		fmt.Fprintln(stdout, "skipped: another replica is pruning")
		return nil
	}
	fmt.Fprintf(stdout, "pruned inbox %d, effects %d, outbox %d, admin_audit %d, outbox_set_aside %d\n",
		st.Inbox, st.Effects, st.Outbox, st.AdminAudit, st.SetAside)
	if st.InboxBuckets+st.BucketsSealed+st.BucketsBusy > 0 {
		fmt.Fprintf(stdout, "inbox buckets: %d removed, %d sealed, %d busy (left for the next pass)\n", st.InboxBuckets, st.BucketsSealed, st.BucketsBusy)
	}
	if st.OutboxNotPermitted {
		fmt.Fprintln(stdout, "outbox: not pruned here, this database role may not delete from onceflow.outbox (the relay prunes published rows after its -retention)")
	}
	return nil
}
