package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/failpoint"
	"github.com/onceflow/onceflow/internal/horizon"
	"github.com/onceflow/onceflow/internal/httpserver"
	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/obs"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/internal/pprofserver"
	"github.com/onceflow/onceflow/internal/wallclock"
	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/retention"
	"github.com/onceflow/onceflow/pkg/schema"
)

// positionalArgs are the positional arguments of the commands that take
// some, for their usage line.
var positionalArgs = map[string]string{
	"consumer dlq replay":      " [EVENT-ID]",
	"consumer gaps resolve":    " SOURCE FROM-TO",
	"consumer gaps give-up":    " SOURCE FROM-TO",
	"consumer effects resolve": " KEY",
	"consumer effects unhold":  " KEY",
}

func parse(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	if err := cli.Parse(fs, args); err != nil {
		if err == flag.ErrHelp {
			fmt.Fprintf(stderr, "usage: %s%s [flags]\n", fs.Name(), positionalArgs[fs.Name()])
			cli.Usage(fs, stderr)
			return err
		}
		return &cli.UsageError{Err: err}
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
		return cli.Usagef("consumer run: unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	log, err := cfg.Log.logger(stderr)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	handler, err := handlerfile.Load(cfg.HandlersFile, handlerfile.OnAfterHTTPCall(failpoint.Func(failpoint.EffectsAfterCall)))
	if err != nil {
		return cli.Usagef("%s: %v", cli.Named("handlers-file"), err)
	}
	tracing, err := obs.NewTracing(ctx, "onceflow-consumer", log, os.Getenv)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	defer tracing.ShutdownLogged(context.WithoutCancel(ctx), log)
	var policy *retention.Policy
	if cfg.RetentionFile != "" {
		if policy, err = loadRetention(cfg.RetentionFile); err != nil {
			return cli.Usagef("%s: %v", cli.Named("retention-file"), err)
		}
	}
	if cfg.RetentionInterval < 0 || (cfg.RetentionInterval > 0 && policy == nil) {
		return cli.Usagef("%s must be positive and needs -retention-file, got %s", cli.Named("retention-interval"), cfg.RetentionInterval)
	}
	pool, err := cfg.DB.Pool(ctx, "onceflow-consumer")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	if err := checkHandlers(ctx, handler, pool, log); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(horizon.NewCollector(pool, "consumer", log))
	icfg := cfg.Inbox
	// The wall clock: the host's, unless a fault test skews it
	// (ONCEFLOW_CLOCK_SKEW; internal/wallclock).
	clock, err := wallclock.FromEnv(os.Getenv)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	if clock.Skew() != 0 {
		log.WarnContext(ctx, "wall clock skewed for fault injection", slog.String("env", wallclock.EnvVar), slog.Duration("skew", clock.Skew()))
	}
	icfg.Clock = clock.Now
	icfg.BatchHandler = handler
	icfg.Hooks = inbox.Hooks{
		OnAfterHandler:  failpoint.Func(failpoint.ConsumerAfterHandler),
		OnAfterPGCommit: failpoint.Func(failpoint.ConsumerAfterPGCommit),
	}
	icfg.KafkaOpts = cfg.Kafka.Opts(log)
	icfg.Logger = log
	icfg.Pool = pool
	icfg.Registerer = reg
	icfg.TracerProvider = tracing.Provider
	if cfg.SchemaRegistryURL != "" {
		if icfg.SchemaRegistry, err = sr.NewClient(sr.URLs(cfg.SchemaRegistryURL)); err != nil {
			return &cli.UsageError{Err: fmt.Errorf("%s: %w", cli.Named("schema-registry-url"), err)}
		}
	}
	c, err := inbox.New(icfg)
	if err != nil {
		return &cli.UsageError{Err: inboxError(err)}
	}
	var pm *retention.Metrics
	if cfg.RetentionInterval > 0 {
		if pm, err = retention.NewMetrics(reg); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.Run(gctx) })
	if cfg.Admin.Enabled {
		h, closeAdmin, err := adminHandler(ctx, &cfg, handler, log)
		if err != nil {
			return err
		}
		defer closeAdmin()
		g.Go(func() error {
			if err := admin.Serve(gctx, cfg.Admin, h, log); err != nil {
				return fmt.Errorf("admin server: %w", err)
			}
			return nil
		})
	}
	if cfg.RetentionInterval > 0 {
		g.Go(func() error {
			return retention.Run(gctx, pool, policy, cfg.RetentionInterval, retention.Options{Consumer: cfg.Inbox.ConsumerName}, pm, log)
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

// adminHandler builds the admin API and console of `consumer run -admin`.
// It has a pool of its own, so that an operator's bulk replay cannot take
// the connections of the partition workers.
func adminHandler(ctx context.Context, cfg *runConfig, h inbox.BatchHandler, log *slog.Logger) (http.Handler, func(), error) {
	tokens, err := admin.LoadTokens(cfg.Admin.TokenFile)
	if err != nil {
		return nil, nil, cli.Usagef("%s: %v", cli.Named("admin-token-file"), err)
	}
	db := cfg.DB
	db.MaxConns = 6
	pool, err := db.Pool(ctx, "onceflow-consumer-admin")
	if err != nil {
		return nil, nil, fmt.Errorf("admin database pool: %w", err)
	}
	kcl, err := kgo.NewClient(cfg.Kafka.Opts(log)...)
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("admin kafka client: %w", err)
	}
	svc, err := admin.NewService(admin.Config{
		Consumer: cfg.Inbox.ConsumerName,
		Group:    cfg.Inbox.Group,
		Topics:   cfg.Inbox.Topics,
		Kafka:    kadm.NewClient(kcl),
		KafkaReader: func(opts ...kgo.Opt) (*kgo.Client, error) {
			return kgo.NewClient(append(cfg.Kafka.Opts(log), opts...)...)
		},
		Logger: log,
		Pool:   pool,
		Replay: replayer(inbox.ReplayConfig{
			ConsumerName: cfg.Inbox.ConsumerName, FirstSeen: cfg.Inbox.FirstSeen, GapTimeout: cfg.Inbox.GapTimeout,
			GapTimeouts: cfg.Inbox.GapTimeouts, Handler: h, MaxParked: cfg.Inbox.MaxParked, Pool: pool,
		}),
		PlannedEffects: plannedEffects(h, cfg.Inbox.ConsumerName),
	})
	if err != nil {
		kcl.Close()
		pool.Close()
		return nil, nil, err
	}
	log.InfoContext(ctx, "admin enabled", slog.String("addr", cfg.Admin.Addr), slog.Any("tokens", tokens.Names()))
	return admin.NewHandler(svc, tokens, log), func() { kcl.Close(); pool.Close() }, nil
}

// plannedEffects is what the handler file's handlers would call for an
// event, for a replay's dry run (nil for another handler).
func plannedEffects(h inbox.BatchHandler, consumer string) func(eventType, eventID string) []effects.Planned {
	plan := handlerfile.PlannedEffects(h)
	if plan == nil {
		return nil
	}
	return func(eventType, eventID string) []effects.Planned { return plan(consumer, eventType, eventID) }
}

// replayer is how this binary re-drives a dead letter, for `dlq replay`
// and the admin API alike: inbox.ReplayConfig.Replay, through the handlers
// and the sequence guard with the consumer's guard settings.
func replayer(rc inbox.ReplayConfig) admin.ReplayFunc {
	return rc.Replay
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	lc := logConfig{Format: os.Getenv(cli.EnvName("log-format")), Level: os.Getenv(cli.EnvName("log-level"))}
	log, err := lc.logger(stderr)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	return migrate.Command(ctx, "consumer", args, stdout, log)
}

// adminService opens a pool of its own on db (application name app) and the
// console's service over it for the consumer name: how the operator
// commands reach the ledger. The caller closes the pool.
func adminService(ctx context.Context, db pgconn.Config, consumer, app string) (*admin.Service, *pgxpool.Pool, error) {
	pool, err := db.Pool(ctx, app)
	if err != nil {
		return nil, nil, fmt.Errorf("database pool: %w", err)
	}
	svc, err := admin.NewService(admin.Config{Consumer: consumer, Pool: pool})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return svc, pool, nil
}

func runDLQList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer dlq list", flag.ContinueOnError)
	var cfg dlqConfig
	cfg.RegisterFlags(fs, false)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("consumer dlq list: unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.DB.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	if cfg.Limit < 1 {
		return cli.Usagef("-limit must be at least 1, got %d", cfg.Limit)
	}
	if cfg.GroupBy != "" && cfg.GroupBy != "error" {
		return cli.Usagef("-group-by %q: want error", cfg.GroupBy)
	}
	if _, err := cfg.Filter.Filter(time.Now()); err != nil {
		return cli.Usagef("consumer dlq list: %v", err)
	}
	svc, pool, err := adminService(ctx, cfg.DB, cfg.ConsumerName, "onceflow-consumer-dlq")
	if err != nil {
		return err
	}
	defer pool.Close()
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if cfg.GroupBy == "error" {
		groups, err := svc.Groups(ctx, cfg.Filter, cfg.Limit)
		if err != nil {
			return err
		}
		printGroups(tw, groups)
		return tw.Flush()
	}
	rows, err := svc.DeadLetters(ctx, cfg.Filter, cfg.Limit)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		hintOtherConsumers(ctx, pool, qConsumersWithInbox, cfg.ConsumerName, "inbox rows", stderr)
	}
	fmt.Fprintln(tw, "EVENT ID\tSTATUS\tSOURCE\tSEQ\tTYPE\tPOSITION\tATTEMPTS\tRECEIVED\tGROUP\tTRACE ID\tLAST ERROR")
	for _, r := range rows {
		trace := r.TraceID
		if trace == "" {
			trace = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s/%d@%d\t%d\t%s\t%s\t%s\t%s\n", r.EventID, r.Status, r.Source, seqText(r.Seq), r.EventType,
			r.Topic, r.Partition, r.Offset, r.Attempts, r.Received.UTC().Format(time.RFC3339), r.Group, trace, oneLine(r.LastError))
	}
	return tw.Flush()
}

func printGroups(tw *tabwriter.Writer, groups []admin.Group) {
	fmt.Fprintln(tw, "GROUP\tSTATUS\tCOUNT\tSOURCES\tTYPES\tFIRST\tLAST\tERROR")
	for _, g := range groups {
		key := g.Key
		if key == "" {
			key = "(no error recorded)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", g.ID, g.Status, g.Count, g.Sources, strings.Join(g.EventTypes, ","),
			g.First.UTC().Format(time.RFC3339), g.Last.UTC().Format(time.RFC3339), oneLine(key))
	}
}

func seqText(seq *int64) string {
	if seq == nil {
		return "-"
	}
	return fmt.Sprint(*seq)
}

func runDLQReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer dlq replay", flag.ContinueOnError)
	var cfg dlqConfig
	cfg.RegisterFlags(fs, true)
	pos, err := parseInterleaved(fs, args, stderr)
	if err != nil {
		return err
	}
	req := admin.ReplayRequest{Note: cfg.Note, DryRun: cfg.DryRun, Filter: cfg.Filter, All: cfg.All, Limit: cfg.Limit, RequestID: cfg.RequestID}
	switch {
	case len(pos) > 1:
		return cli.Usagef("consumer dlq replay: want at most one EVENT-ID, got %d arguments", len(pos))
	case len(pos) == 1:
		req.EventID = pos[0]
	}
	if req.EventID == "" && req.Filter.Empty() && !req.All {
		return cli.Usagef("consumer dlq replay: want an EVENT-ID, or a filter (-event-type, -source, -error, -from/-to/-since, -error-group, -status), or -all")
	}
	if cfg.Expect >= 0 {
		req.Expect = &cfg.Expect
	}
	if err := cfg.DB.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	var replay admin.ReplayFunc
	if cfg.HandlersFile == "" && !cfg.DryRun {
		return cli.Usagef("%s is required", cli.Named("handlers-file"))
	}
	rc, err := cfg.replayConfig()
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	if cfg.HandlersFile != "" {
		if rc.Handler, err = handlerfile.Load(cfg.HandlersFile, handlerfile.OnAfterHTTPCall(failpoint.Func(failpoint.EffectsAfterCall))); err != nil {
			return cli.Usagef("%s: %v", cli.Named("handlers-file"), err)
		}
	}
	if req.RequestID == "" {
		req.RequestID = newRequestID()
	}
	pool, err := cfg.DB.Pool(ctx, "onceflow-consumer-dlq")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	rc.Pool = pool
	var planned func(eventType, eventID string) []effects.Planned
	if rc.Handler != nil {
		replay = replayer(rc)
		planned = plannedEffects(rc.Handler, cfg.ConsumerName)
	}
	svc, err := admin.NewService(admin.Config{Consumer: cfg.ConsumerName, Pool: pool, Replay: replay, PlannedEffects: planned})
	if err != nil {
		return err
	}
	out, err := svc.Replay(ctx, admin.Caller{Actor: cliActor(cfg.Actor), Via: "cli"}, req)
	var bad *admin.BadRequest
	if errors.As(err, &bad) {
		return cli.Usagef("consumer dlq replay: %v", err)
	}
	if err != nil {
		return err
	}
	if req.EventID != "" && !req.DryRun {
		ev := out.Events[0]
		if ev.Error != "" || ev.Result == admin.ResultNotFound {
			if out.Error != "" {
				return errors.New(out.Error)
			}
			return fmt.Errorf("%s: %s", ev.EventID, ev.Error)
		}
		fmt.Fprintf(stdout, "%s: %s\n", ev.EventID, ev.Result)
		return nil
	}
	return printReplay(stdout, out)
}

// printReplay prints a bulk replay's outcome; failures make it an error.
func printReplay(w io.Writer, out admin.ReplayOutcome) error {
	if out.DryRun {
		fmt.Fprintf(w, "dry run: %d event(s) of %d source(s) match; a replay would apply %d, in seq order per source (nothing was changed)\n",
			out.Matched, out.Sources, out.Attempted)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		if len(out.Groups) > 0 {
			printGroups(tw, out.Groups)
			fmt.Fprintln(tw)
		}
		fmt.Fprintln(tw, "FIRST EVENTS\tSOURCE\tSEQ")
		for _, e := range out.Events {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", e.EventID, e.Source, seqText(e.Seq))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		printEffectPreview(w, out.Events)
		if out.Error != "" {
			return errors.New(out.Error)
		}
		return nil
	}
	repeated := ""
	if out.Repeated {
		repeated = " — this request id was already used: its stored result, nothing was done now"
	}
	fmt.Fprintf(w, "request %s (audit #%d)%s\n", out.RequestID, out.AuditID, repeated)
	fmt.Fprintf(w, "matched %d event(s) of %d source(s), took on %d, %d remaining\n", out.Matched, out.Sources, out.Attempted, out.Remaining)
	fmt.Fprintf(w, "replayed %d, replayed late %d, parked %d, already processed %d, failed %d, skipped %d, not found %d, not attempted %d\n",
		out.Replayed, out.ReplayedLate, out.Parked, out.AlreadyProcessed, out.Failed, out.Skipped, out.NotFound, out.NotAttempted)
	for _, e := range out.Events {
		if e.Result == admin.ResultFailed {
			fmt.Fprintf(w, "  failed %s (%s seq %s): %s\n", e.EventID, e.Source, seqText(e.Seq), oneLine(e.Error))
		}
	}
	if out.Error != "" {
		return errors.New(out.Error)
	}
	if out.Failed > 0 || out.Skipped > 0 {
		return fmt.Errorf("%d event(s) failed and %d later event(s) of their sources were skipped; fix the cause and replay again", out.Failed, out.Skipped)
	}
	return nil
}

// printEffectPreview lists, per event of a dry run, its external effects
// and what a replay would do with each.
func printEffectPreview(w io.Writer, evs []admin.EventOutcome) {
	n := 0
	for _, e := range evs {
		n += len(e.Effects)
	}
	if n == 0 {
		fmt.Fprintln(w, "\neffects: none recorded for these events, and no http handler would make one")
		return
	}
	fmt.Fprintln(w, "\neffects (those recorded in the ledger for the event, and the ones the handlers file would make; an effect a handler keys otherwise is not known until it runs):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT\tSCOPE\tKEY\tLEDGER\tATTEMPTS\tAGE\tWINDOW\tREPLAY WOULD")
	for _, e := range evs {
		for _, p := range e.Effects {
			status, win := p.Status, "-"
			if status == "" {
				status = "-"
			}
			if p.WindowSeconds > 0 {
				win = (time.Duration(p.WindowSeconds) * time.Second).String()
			}
			age := "-"
			if p.Status != "" {
				age = (time.Duration(p.AgeSeconds) * time.Second).String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", e.EventID, p.Scope, p.Key, status, p.Attempts, age, win, p.Verdict)
		}
	}
	_ = tw.Flush()
}

// newRequestID is a random request id for a command's change.
func newRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "cli-" + hex.EncodeToString(b)
}

// cliActor is who runs an operator command, for the audit.
func cliActor(flagValue string) string {
	if a := admin.CleanActor(flagValue); a != "" {
		return a
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return admin.CleanActor(u)
	}
	return "unknown"
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// checkHandlers prepares the handler file's sql statements at start: a
// statement the database refuses (a missing table, a type mismatch) would
// dead-letter every event of its type, so it stops the consumer with the
// handler named. A database not reachable yet is left to the engine's
// retries.
func checkHandlers(ctx context.Context, h inbox.BatchHandler, pool *pgxpool.Pool, log *slog.Logger) error {
	// The schema first: on a database nobody migrated, that is the news
	// (the handlers' own tables are likely missing too).
	if err := schema.Check(ctx, pool); errors.Is(err, schema.ErrNotMigrated) || errors.Is(err, schema.ErrOutdated) {
		return err
	}
	res, err := handlerfile.Check(ctx, h, pool)
	var ce *handlerfile.CheckError
	switch {
	case errors.As(err, &ce):
		return cli.Usagef("%s: %v", cli.Named("handlers-file"), err)
	case err != nil:
		log.WarnContext(ctx, "handler file not checked against the database", slog.Any("error", err))
	default:
		log.InfoContext(ctx, "handler file checked against the database", slog.Int("handlers", res.Handlers), slog.Int("sql_statements", res.Statements))
	}
	return nil
}

// checkConfig is the configuration of `consumer check`.
type checkConfig struct {
	DB           pgconn.Config
	HandlersFile string
}

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer check", flag.ContinueOnError)
	var cfg checkConfig
	cfg.DB.RegisterFlags(fs)
	fs.StringVar(&cfg.HandlersFile, "handlers-file", "", handlersFileHelp)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("consumer check: unexpected argument %q", fs.Arg(0))
	}
	if cfg.HandlersFile == "" {
		return cli.Usagef("%s is required", cli.Named("handlers-file"))
	}
	if err := cfg.DB.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	h, err := handlerfile.Load(cfg.HandlersFile)
	if err != nil {
		return cli.Usagef("%s: %v", cli.Named("handlers-file"), err)
	}
	pool, err := cfg.DB.Pool(ctx, "onceflow-consumer-check")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	if err := schema.Check(ctx, pool); err != nil {
		return err
	}
	res, err := handlerfile.Check(ctx, h, pool)
	if err != nil {
		var ce *handlerfile.CheckError
		if errors.As(err, &ce) {
			for _, p := range ce.Problems {
				fmt.Fprintln(stdout, "refused:", p)
			}
		}
		return err
	}
	fmt.Fprintf(stdout, "%s: %d handlers, %d sql statements prepared against the database: ok\n", cfg.HandlersFile, res.Handlers, res.Statements)
	return nil
}

// The consumer names that have rows, for the hint of an empty listing. The
// inbox is walked by its primary key's first column, one probe per name
// (a loose index scan), however many rows it holds.
const (
	qConsumersWithInbox = `
WITH RECURSIVE c (name) AS (
    SELECT min(consumer) FROM onceflow.inbox
    UNION ALL
    SELECT (SELECT min(i.consumer) FROM onceflow.inbox i WHERE i.consumer > c.name) FROM c WHERE c.name IS NOT NULL
)
SELECT name FROM c WHERE name IS NOT NULL AND name <> $1 LIMIT 20`
	qConsumersWithGaps = `SELECT DISTINCT consumer FROM onceflow.seq_gaps WHERE consumer <> $1 ORDER BY 1 LIMIT 20`
)

// hintOtherConsumers tells, under an empty listing, which other consumer
// names this database has rows for: the list commands default to the name
// "default", and a deployment that set -consumer-name elsewhere otherwise
// sees an empty table and no clue.
func hintOtherConsumers(ctx context.Context, pool *pgxpool.Pool, query, name, what string, w io.Writer) {
	rows, err := pool.Query(ctx, query, name)
	if err != nil {
		return // a hint, not a verdict
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) == 0 {
		return
	}
	fmt.Fprintf(w, "consumer: nothing for consumer name %q; this database has %s for: %s (pass %s)\n",
		name, what, strings.Join(names, ", "), cli.Named("consumer-name"))
}
