package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/httpserver"
	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/pprofserver"
	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/inbox"
)

func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	if err := cli.Parse(fs, args); err != nil {
		if err == flag.ErrHelp {
			fmt.Fprintf(stderr, "usage: %s [flags]\n", fs.Name())
			cli.Usage(fs, stderr)
			return err
		}
		return &usageError{err}
	}
	return nil
}

func runConsumer(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer run", flag.ContinueOnError)
	var cfg runConfig
	cfg.RegisterFlags(fs)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usage("consumer run: unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.validate(); err != nil {
		return &usageError{err}
	}
	log, err := cfg.Log.logger(stderr)
	if err != nil {
		return &usageError{err}
	}
	handler, err := inbox.LoadHandlerFile(cfg.HandlersFile)
	if err != nil {
		return usage("-handlers-file (ONCEFLOW_HANDLERS_FILE): %v", err)
	}
	var retention *effects.Retention
	if cfg.RetentionFile != "" {
		if retention, err = loadRetention(cfg.RetentionFile); err != nil {
			return usage("-retention-file (ONCEFLOW_RETENTION_FILE): %v", err)
		}
	}
	if cfg.PruneInterval < 0 || (cfg.PruneInterval > 0 && retention == nil) {
		return usage("-prune-interval (ONCEFLOW_PRUNE_INTERVAL) must be positive and needs -retention-file, got %s", cfg.PruneInterval)
	}
	pool, err := cfg.DB.Pool(ctx, "onceflow-consumer")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c, err := inbox.New(inbox.Config{
		BatchHandler:         handler,
		BatchMaxRecords:      cfg.BatchMaxRecords,
		ConsumerName:         cfg.ConsumerName,
		DLQTopic:             cfg.DLQTopic,
		FirstSeen:            cfg.firstSeen,
		GapCheckInterval:     cfg.GapCheckInterval,
		GapTimeout:           cfg.GapTimeout,
		GapTimeouts:          cfg.gapTimeouts,
		Group:                cfg.Group,
		InstanceID:           cfg.InstanceID,
		KafkaOpts:            cfg.Kafka.Opts(log),
		LatePolicy:           cfg.latePolicy,
		Logger:               log,
		MaxParked:            cfg.MaxParked,
		MaxPayloadBytes:      cfg.MaxPayloadBytes,
		Ordering:             cfg.ordering,
		Pool:                 pool,
		Registerer:           reg,
		RetryInitialInterval: cfg.RetryInitialInterval,
		RetryMaxAttempts:     cfg.RetryMaxAttempts,
		RetryMaxElapsed:      cfg.RetryMaxElapsed,
		RetryMaxInterval:     cfg.RetryMaxInterval,
		Topics:               cfg.Topics,
	})
	if err != nil {
		return &usageError{err}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.Run(gctx) })
	if cfg.PruneInterval > 0 {
		pm := effects.NewPrunerMetrics(reg)
		g.Go(func() error {
			return effects.RunPruner(gctx, pool, retention, cfg.PruneInterval, effects.PruneOptions{}, pm, log)
		})
	}
	g.Go(func() error {
		return httpserver.Serve(gctx, httpserver.Config{Addr: cfg.HTTPAddr, Gatherer: reg, Ready: c.Ready, Logger: log},
			func(a net.Addr) { log.InfoContext(ctx, "http listening", slog.String("addr", a.String())) })
	})
	g.Go(func() error {
		if err := pprofserver.Serve(gctx, cfg.PprofAddr, log, func(a net.Addr) {
			log.InfoContext(ctx, "pprof listening", slog.String("addr", a.String()))
		}); err != nil {
			return fmt.Errorf("pprof server: %w", err)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return err
	}
	log.InfoContext(context.WithoutCancel(ctx), "consumer exited cleanly")
	return nil
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var lc logConfig
	log, _ := lc.logger(stderr)
	err := migrate.Command(ctx, "consumer", args, stdout, log)
	if err != nil && err != flag.ErrHelp && strings.Contains(err.Error(), "ONCEFLOW_") {
		return &usageError{err} // a bad setting, named
	}
	return err
}

func runDLQList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer dlq list", flag.ContinueOnError)
	var cfg dlqConfig
	cfg.RegisterFlags(fs, false)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if err := cfg.DB.Validate(); err != nil {
		return &usageError{err}
	}
	if cfg.Limit < 1 {
		return usage("-limit (ONCEFLOW_LIMIT) must be at least 1, got %d", cfg.Limit)
	}
	pool, err := cfg.DB.Pool(ctx, "onceflow-consumer-dlq")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	rows, err := inbox.ListDeadLetters(ctx, pool, cfg.ConsumerName, cfg.Limit)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT ID\tSTATUS\tSOURCE\tSEQ\tTYPE\tPOSITION\tATTEMPTS\tRECEIVED\tLAST ERROR")
	for _, r := range rows {
		seq := "-"
		if r.Seq != nil {
			seq = fmt.Sprint(*r.Seq)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s/%d@%d\t%d\t%s\t%s\n", r.EventID, r.Status, r.Source, seq, r.EventType,
			r.Topic, r.Partition, r.Offset, r.Attempts, r.Received.UTC().Format(time.RFC3339), oneLine(r.LastError))
	}
	return tw.Flush()
}

func runDLQReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer dlq replay", flag.ContinueOnError)
	var cfg dlqConfig
	cfg.RegisterFlags(fs, true)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usage("consumer dlq replay: want exactly one EVENT-ID argument (flags go before it)")
	}
	if err := cfg.DB.Validate(); err != nil {
		return &usageError{err}
	}
	if cfg.HandlersFile == "" {
		return usage("-handlers-file (ONCEFLOW_HANDLERS_FILE) is required")
	}
	handler, err := inbox.LoadHandlerFile(cfg.HandlersFile)
	if err != nil {
		return usage("-handlers-file (ONCEFLOW_HANDLERS_FILE): %v", err)
	}
	pool, err := cfg.DB.Pool(ctx, "onceflow-consumer-dlq")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	res, err := inbox.Replay(ctx, pool, cfg.ConsumerName, handler, fs.Arg(0))
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s\n", fs.Arg(0), res)
	return nil
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
