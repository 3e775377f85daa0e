package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

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

	ClockMargin  time.Duration
	ConsumerOnly bool
	ConsumerName string
	From, To     string
	FromID, ToID int64
	Group        string
	JSON         bool
	MaxRanges    int
	Record       bool
	Settle       time.Duration
	Since        time.Duration
	Timeout      time.Duration
	Topics       cli.List
}

func (c *reconcileConfig) RegisterFlags(fs *flag.FlagSet) {
	c.DB.RegisterFlags(fs)
	c.Kafka.RegisterFlags(fs, "onceflow-reconcile")
	c.Log.RegisterFlags(fs)
	fs.StringVar(&c.OutboxDB.URL, "outbox-database-url", "", "PostgreSQL URL of the producing database (its outbox and publish log; a relay-role login will do); default: -database-url")
	fs.StringVar(&c.OutboxDB.PasswordFile, "outbox-database-password-file", "", "file holding the producing database's password (overrides one in its URL)")
	fs.StringVar(&c.ConsumerName, "consumer-name", inbox.DefaultConsumerName, consumerNameHelp)
	fs.StringVar(&c.Group, "group", "", "Kafka consumer group of the consumer (its stored offsets say how far it got) (required)")
	fs.Var(&c.Topics, "topics", "comma-separated topics to reconcile (required)")
	fs.DurationVar(&c.Since, "since", time.Hour, "window: the outbox rows committed this long ago until now (unless -from or -from-id)")
	fs.StringVar(&c.From, "from", "", "window start, RFC 3339 (instead of -since)")
	fs.StringVar(&c.To, "to", "", "window end, RFC 3339 (default: now)")
	fs.Int64Var(&c.FromID, "from-id", 0, "window: outbox ids from this one (instead of a time window)")
	fs.Int64Var(&c.ToID, "to-id", 0, "with -from-id: the last outbox id (default: no limit)")
	fs.DurationVar(&c.Settle, "settle", reconcile.DefaultSettle, "leave out the rows committed this recently (the relay may not have published them yet)")
	fs.DurationVar(&c.ClockMargin, "clock-margin", reconcile.DefaultClockMargin, "how far the clocks of the database, relay and consumer may disagree")
	fs.IntVar(&c.MaxRanges, "max-ranges", reconcile.DefaultMaxRanges, "memory bound: most seq ranges held (about 16 bytes each, a stream counts 32); beyond it the run stops (status 2)")
	fs.BoolVar(&c.ConsumerOnly, "consumer-only", false, "judge the consumer's side only (a relay with -delete-on-publish keeps no record of what it published)")
	fs.BoolVar(&c.JSON, "json", false, "print the report as JSON instead of the summary")
	fs.BoolVar(&c.Record, "record", true, "store the run's summary in onceflow.reconcile_runs for the console (-record=false: write nothing)")
	fs.DurationVar(&c.Timeout, "timeout", 10*time.Minute, "give up the run after this long (status 2)")
	cli.Local(fs, "consumer-only", "since", "from", "to", "from-id", "to-id", "settle", "clock-margin", "max-ranges", "json", "record", "timeout")
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
	couldNotRun := func(err error) error {
		return &cli.StatusError{Status: 2, Err: fmt.Errorf("reconcile could not run: %w", err)}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	pool, err := cfg.DB.Pool(ctx, "onceflow-reconcile")
	if err != nil {
		return couldNotRun(fmt.Errorf("consumer database: %w", err))
	}
	defer pool.Close()
	rc.ConsumerPool, rc.OutboxPool = pool, pool
	if cfg.OutboxDB.URL != "" {
		var opool *pgxpool.Pool
		if opool, err = cfg.OutboxDB.Pool(ctx, "onceflow-reconcile"); err != nil {
			return couldNotRun(fmt.Errorf("producing database: %w", err))
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
		return couldNotRun(err)
	}
	if cfg.JSON {
		err = reconcile.WriteJSON(stdout, rep)
	} else {
		err = reconcile.WriteText(stdout, rep)
	}
	if err != nil {
		return couldNotRun(err)
	}
	if cfg.Record {
		if err := reconcile.Record(ctx, pool, rep); err != nil {
			return couldNotRun(fmt.Errorf("record the run (-record=false skips it): %w", err))
		}
	}
	if !rep.Clean() {
		return &cli.StatusError{Status: 1, Err: fmt.Errorf("reconcile: %d anomalies", rep.Anomalies)}
	}
	return nil
}

// engineConfig checks the flags and returns the engine's config (without
// pools and logger).
func (c *reconcileConfig) engineConfig(set map[string]bool) (reconcile.Config, error) {
	rc := reconcile.Config{ClockMargin: c.ClockMargin, Consumer: c.ConsumerName, ConsumerOnly: c.ConsumerOnly, FromID: c.FromID, ToID: c.ToID,
		Group: c.Group, MaxRanges: c.MaxRanges, Settle: c.Settle, Topics: c.Topics}
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
	if c.Settle == 0 {
		rc.Settle = -1 // none (the engine's zero is its default)
	}
	switch {
	case c.Group == "":
		return rc, fmt.Errorf("%s is required", cli.Named("group"))
	case len(c.Topics) == 0:
		return rc, fmt.Errorf("%s is required", cli.Named("topics"))
	case c.MaxRanges < 1:
		return rc, fmt.Errorf("-max-ranges must be at least 1, got %d", c.MaxRanges)
	case c.Settle < 0 || c.ClockMargin < 0:
		return rc, errors.New("-settle and -clock-margin must not be negative")
	case c.Timeout <= 0:
		return rc, fmt.Errorf("-timeout must be positive, got %s", c.Timeout)
	}
	byTime := set["since"] || set["from"] || set["to"]
	byID := set["from-id"] || set["to-id"]
	switch {
	case byTime && byID:
		return rc, errors.New("a time window (-since, -from, -to) or an id range (-from-id, -to-id), not both")
	case set["since"] && set["from"]:
		return rc, errors.New("-since or -from, not both")
	case byID:
		if c.FromID < 1 {
			return rc, fmt.Errorf("-from-id must be at least 1, got %d", c.FromID)
		}
		if c.ToID != 0 && c.ToID < c.FromID {
			return rc, fmt.Errorf("-to-id (%d) must be at least -from-id (%d)", c.ToID, c.FromID)
		}
		return rc, nil
	}
	now := time.Now()
	if c.To != "" {
		to, err := time.Parse(time.RFC3339, c.To)
		if err != nil {
			return rc, fmt.Errorf("-to: want an RFC 3339 time, got %q", c.To)
		}
		rc.To, now = to, to
	}
	if c.From != "" {
		from, err := time.Parse(time.RFC3339, c.From)
		if err != nil {
			return rc, fmt.Errorf("-from: want an RFC 3339 time, got %q", c.From)
		}
		rc.From = from
	} else {
		if c.Since <= 0 {
			return rc, fmt.Errorf("-since must be positive, got %s", c.Since)
		}
		rc.From = now.Add(-c.Since)
	}
	if !rc.To.IsZero() && !rc.To.After(rc.From) {
		return rc, errors.New("-to must be after -from")
	}
	return rc, nil
}
