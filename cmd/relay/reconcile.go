package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/kafkaconn"
	"github.com/onceflow/onceflow/internal/obs"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/internal/reconcile"
)

// runReconcile is `relay reconcile`: the relay's side of the check `consumer
// reconcile` makes end to end. For a window of the outbox it compares the
// rows this database committed with its relay's records on the topics
// (read_committed) and reports committed but not published, published but
// never committed, published twice and out of order. Read-only; exit status
// 0 clean, 1 anomalies, 2 could not run.
func runReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("relay reconcile", flag.ContinueOnError)
	var (
		db    pgconn.Config
		kafka kafkaconn.Config
		run   reconcile.Flags
	)
	db.RegisterFlags(fs)
	kafka.RegisterFlags(fs, "onceflow-reconcile")
	run.Register(fs)
	if _, err := parseInterleaved(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("relay reconcile: unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	rc := reconcile.Config{ProducerOnly: true}
	if err := errors.Join(db.Validate(), kafka.Validate()); err != nil {
		return &cli.UsageError{Err: err}
	}
	if err := run.Apply(set, &rc); err != nil {
		return &cli.UsageError{Err: err}
	}
	rc.KafkaOpts = kafka.Opts(nil)
	log, err := obs.NewLogger(stderr, os.Getenv(cli.EnvName("log-format")), os.Getenv(cli.EnvName("log-level")))
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	rc.Logger = log
	ctx, cancel := context.WithTimeout(ctx, run.Timeout)
	defer cancel()
	pool, err := db.Pool(ctx, "onceflow-reconcile")
	if err != nil {
		return reconcile.CouldNotRun(fmt.Errorf("producing database: %w", err))
	}
	defer pool.Close()
	rc.OutboxPool = pool
	rep, err := reconcile.Run(ctx, rc)
	if err != nil {
		return reconcile.CouldNotRun(err)
	}
	if err := run.Print(stdout, rep); err != nil {
		return reconcile.CouldNotRun(err)
	}
	return reconcile.Verdict(rep)
}
