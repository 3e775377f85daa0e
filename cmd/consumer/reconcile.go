package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/kafkaconn"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/internal/reconcile"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// reconcileConfig is the configuration of `consumer reconcile`.
type reconcileConfig struct {
	DB       pgconn.Config // the consumer's database
	OutboxDB pgconn.Config // the producing database (default: DB)
	Kafka    kafkaconn.Config
	Log      logConfig
	Run      reconcile.Flags

	ConsumerOnly bool
	ConsumerName string
	Group        string
	Record       bool
}

func (c *reconcileConfig) RegisterFlags(fs *flag.FlagSet) {
	c.DB.RegisterFlags(fs)
	c.Kafka.RegisterFlags(fs, "onceflow-reconcile")
	c.Log.RegisterFlags(fs)
	c.Run.Register(fs)
	fs.StringVar(&c.OutboxDB.URL, "outbox-database-url", "", "PostgreSQL URL of the producing database (its outbox and publish log; a relay-role login will do); default: -database-url")
	fs.StringVar(&c.OutboxDB.PasswordFile, "outbox-database-password-file", "", "file holding the producing database's password (overrides one in its URL)")
	fs.StringVar(&c.ConsumerName, "consumer-name", inbox.DefaultConsumerName, consumerNameHelp)
	fs.StringVar(&c.Group, "group", "", "Kafka consumer group of the consumer (its stored offsets say how far it got) (required)")
	fs.BoolVar(&c.ConsumerOnly, "consumer-only", false, "judge the consumer's side only (a relay with -delete-on-publish keeps no record of what it published)")
	fs.BoolVar(&c.Record, "record", true, "store the run's summary in onceflow.reconcile_runs for the console (-record=false: write nothing)")
	cli.Local(fs, "consumer-only", "record")
}

// runReconcile is `consumer reconcile`: exit status 0 clean, 1 anomalies,
// 2 could not run (usage, configuration, a database or the topics).
func runReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer reconcile", flag.ContinueOnError)
	var cfg reconcileConfig
	cfg.RegisterFlags(fs)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("consumer reconcile: unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	rc, err := cfg.engineConfig(set)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	log, err := cfg.Log.logger(stderr)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	rc.Logger = log
	ctx, cancel := context.WithTimeout(ctx, cfg.Run.Timeout)
	defer cancel()
	pool, err := cfg.DB.Pool(ctx, "onceflow-reconcile")
	if err != nil {
		return reconcile.CouldNotRun(fmt.Errorf("consumer database: %w", err))
	}
	defer pool.Close()
	rc.ConsumerPool, rc.OutboxPool = pool, pool
	if cfg.OutboxDB.URL != "" {
		var opool *pgxpool.Pool
		if opool, err = cfg.OutboxDB.Pool(ctx, "onceflow-reconcile"); err != nil {
			return reconcile.CouldNotRun(fmt.Errorf("producing database: %w", err))
		}
		defer opool.Close()
		rc.OutboxPool = opool
	}
	rep, err := reconcile.Run(ctx, rc)
	if err != nil {
		var ce *reconcile.ConfigError
		if errors.As(err, &ce) {
			return &cli.UsageError{Err: err}
		}
		return reconcile.CouldNotRun(err)
	}
	if err := cfg.Run.Print(stdout, rep); err != nil {
		return reconcile.CouldNotRun(err)
	}
	if cfg.Record {
		if err := reconcile.Record(ctx, pool, rep); err != nil {
			return reconcile.CouldNotRun(fmt.Errorf("record the run (-record=false skips it): %w", err))
		}
	}
	return reconcile.Verdict(rep)
}

// engineConfig checks the flags and returns the engine's config (without
// pools and logger).
func (c *reconcileConfig) engineConfig(set map[string]bool) (reconcile.Config, error) {
	rc := reconcile.Config{Consumer: c.ConsumerName, ConsumerOnly: c.ConsumerOnly, Group: c.Group}
	c.OutboxDB.MaxConns = c.DB.MaxConns
	if err := c.DB.Validate(); err != nil {
		return rc, err
	}
	if c.OutboxDB.URL != "" {
		if _, err := pgxpool.ParseConfig(c.OutboxDB.URL); err != nil {
			return rc, fmt.Errorf("%s: %v", cli.Named("outbox-database-url"), err)
		}
	} else if c.OutboxDB.PasswordFile != "" {
		return rc, fmt.Errorf("%s needs %s", cli.Named("outbox-database-password-file"), cli.Named("outbox-database-url"))
	}
	if err := c.Kafka.Validate(); err != nil {
		return rc, err
	}
	rc.KafkaOpts = c.Kafka.Opts(nil)
	if c.Group == "" {
		return rc, fmt.Errorf("%s is required", cli.Named("group"))
	}
	return rc, c.Run.Apply(set, &rc)
}
