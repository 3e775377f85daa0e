// Command relay publishes onceflow's PostgreSQL outbox to Kafka.
//
//	relay run      [flags]   publish (one leader per shard, the others stand by)
//	relay migrate  [flags]   apply the schema migrations
//	relay topics verify|apply [flags]   check or create the topics of contract/topics.json
//	relay identity show|adopt|reset|legacy …   this database's identity (see admin.go)
//	relay outbox failed list|retry|skip …       rows set aside because Kafka refuses them
//	relay reconcile -topics T [-since 1h]       check the outbox against the topics (read-only)
//
// `relay run -admin` also serves the relay's status as JSON
// (GET /api/v1/relay, bearer token; docs/console.md).
//
// Every setting has an ONCEFLOW_* environment fallback (-database-url is
// ONCEFLOW_DATABASE_URL); flags win. The per-invocation choices of the
// operator commands (-note, -all, migrate's -to) are flags only. Invalid
// usage or configuration exits with status 2, a failure at run time with 1
// (cli.ExitCode). See docs/relay.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/horizon"
	"github.com/onceflow/onceflow/internal/httpserver"
	"github.com/onceflow/onceflow/internal/kafkaconn"
	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/obs"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/internal/pprofserver"
	"github.com/onceflow/onceflow/internal/topics"
	"github.com/onceflow/onceflow/internal/wallclock"
	"github.com/onceflow/onceflow/pkg/relay"
)

// main exits with cli.ExitCode, the rule of every subcommand of both
// binaries: 2 for invalid usage or configuration (a *cli.UsageError), 1 for
// a failure at run time.
func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return
	}
	fmt.Fprintln(os.Stderr, "relay:", err)
	os.Exit(cli.ExitCode(err))
}

const usage = `usage: relay run [flags] | relay migrate [flags] | relay topics verify|apply [flags] | relay help
       relay identity show|adopt|reset|legacy … | relay outbox failed list|retry|skip …
       relay reconcile -topics T [-since 1h | -from-id N] [-json]

Tracing: the standard OpenTelemetry variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...); off when none is set. See docs/tracing.md.
`

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return cli.Usagef("a subcommand is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "run":
		return runRelay(ctx, args[1:], stderr)
	case "migrate":
		log, err := obs.NewLogger(stderr, os.Getenv(cli.EnvName("log-format")), os.Getenv(cli.EnvName("log-level")))
		if err != nil {
			return &cli.UsageError{Err: err}
		}
		return migrate.Command(ctx, "relay", args[1:], stdout, log)
	case "topics":
		log, err := obs.NewLogger(stderr, os.Getenv(cli.EnvName("log-format")), os.Getenv(cli.EnvName("log-level")))
		if err != nil {
			return &cli.UsageError{Err: err}
		}
		return topics.Command(ctx, "relay", args[1:], stdout, log)
	case "identity", "outbox":
		return runAdmin(ctx, args, stdout)
	case "reconcile":
		return runReconcile(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage+"\nrelay run flags:\n")
		var c config
		fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
		c.RegisterFlags(fs)
		cli.Usage(fs, stdout)
		fmt.Fprint(stdout, "\n"+adminUsage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return cli.Usagef("unknown subcommand %q", args[0])
	}
}

// Help texts of the flags `relay run` shares with the operator commands:
// one environment name, one meaning, one text.
const (
	shardHelp       = "relay shard: lease row, transactional.id suffix, checkpoint key suffix; with -shards N over 1, the shard's index 0..N-1"
	txnIDPrefixHelp = "Kafka transactional.id prefix, the shard is appended; must be unique to this database on the Kafka cluster (empty: onceflow-relay-<database identity>-, unique by construction)"
)

// config is everything `relay run` is configured with. The relay's own
// settings are flags bound straight onto relay.Config, with the library's
// defaults; the library's Validate is their only check.
type config struct {
	admin     admin.Flags
	db        pgconn.Config
	kafka     kafkaconn.Config
	httpAddr  string
	pprofAddr string
	logFormat string
	logLevel  string

	outbox relay.Config

	topicsVerify bool
	topics       topics.Config
	registryURL  string
}

// outboxFlags is the flag of each relay.Config field `relay run` sets: an
// invalid value is reported by its flag and environment variable.
var outboxFlags = cli.Fields{
	"BackoffMax":            "backoff-max",
	"BatchMaxBytes":         "batch-max-bytes",
	"BatchMaxRows":          "batch-max-rows",
	"CheckpointTopic":       "checkpoint-topic",
	"DeleteOnPublish":       "delete-on-publish",
	"HolderID":              "holder-id",
	"LeaseRenewInterval":    "lease-renew-interval",
	"LeaseTTL":              "lease-ttl",
	"Listen":                "listen",
	"PollInterval":          "poll-interval",
	"PruneBatchRows":        "prune-batch-rows",
	"PruneInterval":         "prune-interval",
	"Retention":             "retention",
	"RetrySetAsideAfter":    "retry-set-aside-after",
	"Shard":                 "shard",
	"Shards":                "shards",
	"StandbyInterval":       "standby-interval",
	"StatsInterval":         "stats-interval",
	"TransactionTimeout":    "transaction-timeout",
	"TransactionalIDPrefix": "transactional-id-prefix",
}

// outboxError reports an relay.Config error by flag.
func outboxError(err error) error {
	var ce *relay.ConfigError
	if errors.As(err, &ce) {
		return outboxFlags.Error("outbox config", ce.Field, ce.Reason)
	}
	return err
}

// RegisterFlags registers the flags of `relay run`.
func (c *config) RegisterFlags(fs *flag.FlagSet) {
	c.admin.RegisterFlags(fs, "127.0.0.1:9092")
	c.db.RegisterFlags(fs)
	c.kafka.RegisterFlags(fs, "onceflow-relay")
	fs.StringVar(&c.httpAddr, "http-addr", ":9465", "address of /metrics, /healthz and /readyz (empty disables)")
	fs.StringVar(&c.pprofAddr, "pprof-addr", "", "address of Go's /debug/pprof profiles, e.g. 127.0.0.1:6060 (empty, the default, disables)")
	fs.StringVar(&c.logFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	o := &c.outbox
	fs.DurationVar(&o.BackoffMax, "backoff-max", relay.DefaultBackoffMax, "longest wait between retries of Kafka and PostgreSQL errors")
	fs.IntVar(&o.BatchMaxBytes, "batch-max-bytes", relay.DefaultBatchMaxBytes, "maximum payload bytes per Kafka transaction")
	fs.IntVar(&o.BatchMaxRows, "batch-max-rows", relay.DefaultBatchMaxRows, "maximum rows per Kafka transaction")
	fs.StringVar(&o.CheckpointTopic, "checkpoint-topic", relay.DefaultCheckpointTopic, "compacted topic for the relay's checkpoints (created if missing)")
	fs.BoolVar(&o.DeleteOnPublish, "delete-on-publish", false, "delete rows once published instead of keeping them and a publish log for -retention (a faster drain; no record of what was published)")
	fs.StringVar(&o.HolderID, "holder-id", "", "this process's name in the lease table; stable across restarts, unique among live relays (default hostname-pid-random)")
	fs.DurationVar(&o.LeaseRenewInterval, "lease-renew-interval", relay.DefaultLeaseRenewInterval, "how often the leader renews its lease")
	fs.DurationVar(&o.LeaseTTL, "lease-ttl", relay.DefaultLeaseTTL, "lease lifetime without renewal (takeover time after a leader dies)")
	fs.BoolVar(&o.Listen, "listen", false, "also wake on NOTIFY onceflow_outbox (enable the trigger onceflow.outbox_notify for producers to notify)")
	fs.DurationVar(&o.PollInterval, "poll-interval", relay.DefaultPollInterval, "wait between polls of an empty outbox")
	fs.IntVar(&o.PruneBatchRows, "prune-batch-rows", relay.DefaultPruneBatchRows, "published rows deleted per prune statement")
	fs.DurationVar(&o.PruneInterval, "prune-interval", relay.DefaultPruneInterval, "how often published rows are pruned")
	fs.DurationVar(&o.Retention, "retention", relay.DefaultRetention, "how long published rows are kept (negative: delete at the next prune)")
	fs.DurationVar(&o.RetrySetAsideAfter, "retry-set-aside-after", relay.DefaultRetrySetAsideAfter, "first automatic retry of a row set aside for a missing topic, ACL or topic contract (doubles per refusal, up to 10m); rows refused for their content wait for `relay outbox failed retry|skip`")
	fs.StringVar(&o.Shard, "shard", relay.DefaultShard, shardHelp)
	fs.IntVar(&o.Shards, "shards", relay.DefaultShards, "how many shards split the database's sources, each with its own leader; with more than 1, -shard is this relay's index 0..shards-1 (docs/relay.md, \"Shards\")")
	fs.DurationVar(&o.StandbyInterval, "standby-interval", relay.DefaultStandbyInterval, "how often a standby tries to take the lease")
	fs.DurationVar(&o.StatsInterval, "stats-interval", relay.DefaultStatsInterval, "how often the leader refreshes the pending-rows and oldest-age gauges")
	fs.StringVar(&o.TransactionalIDPrefix, "transactional-id-prefix", "", txnIDPrefixHelp)
	fs.DurationVar(&o.TransactionTimeout, "transaction-timeout", relay.DefaultTransactionTimeout, "Kafka transaction timeout")
	fs.BoolVar(&c.topicsVerify, "topics-verify", false, "verify the checkpoint topic at start and each event topic before its first publish against the topic spec; refuse to publish to a topic that breaks it (create topics with `relay topics apply` first)")
	c.topics.RegisterFlags(fs)
	fs.StringVar(&c.registryURL, "schema-registry-url", "", cli.SchemaRegistryHelp)
}

func (c *config) validate() error {
	if err := c.db.Validate(); err != nil {
		return err
	}
	if err := c.admin.Validate(); err != nil {
		return err
	}
	if err := c.kafka.Validate(); err != nil {
		return err
	}
	return outboxError(c.outbox.Validate())
}

func runRelay(ctx context.Context, args []string, stderr io.Writer) error {
	var c config
	fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := cli.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, "usage: relay run [flags]\n")
			cli.Usage(fs, stderr)
			return err
		}
		return &cli.UsageError{Err: err}
	}
	if err := c.validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	log, err := obs.NewLogger(stderr, c.logFormat, c.logLevel)
	if err != nil {
		return cli.Usagef("%s / %s: %v", cli.Named("log-format"), cli.Named("log-level"), err)
	}
	tracing, err := obs.NewTracing(ctx, "onceflow-relay", log, os.Getenv)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	defer tracing.ShutdownLogged(context.WithoutCancel(ctx), log)
	pool, err := c.db.Pool(ctx, "onceflow-relay")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()

	var topicCheck func(context.Context, string) error
	if c.topicsVerify {
		admCl, err := kgo.NewClient(c.kafka.Opts(log)...)
		if err != nil {
			return fmt.Errorf("kafka admin client: %w", err)
		}
		defer admCl.Close()
		adm := kadm.NewClient(admCl)
		if _, err := c.topics.Load(); err != nil {
			return &cli.UsageError{Err: err}
		}
		if err := checkCheckpointTopic(ctx, log, c.outbox.BackoffMax, func() error {
			return c.topics.CheckTopics(ctx, adm, c.outbox.CheckpointTopic)
		}); err != nil {
			return fmt.Errorf("checkpoint topic breaks the topic spec (run `relay topics apply`): %w", err)
		}
		topicCheck = func(ctx context.Context, topic string) error {
			err := c.topics.CheckTopics(ctx, adm, topic)
			if errors.Is(err, topics.ErrDrift) {
				return fmt.Errorf("%w: %w", relay.ErrTopicRefused, err)
			}
			return err
		}
	}

	// Each topic's wire format, from the topic spec (docs/contract.md, "Wire
	// formats"): the schemas must be registered (relay topics apply) before
	// the relay starts.
	spec, err := c.topics.Load()
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	var registry *sr.Client
	if spec.NeedsRegistry() {
		if c.registryURL == "" {
			return cli.Usagef("%s is required: the topic spec has topics in avro, protobuf or json-schema", cli.Named("schema-registry-url"))
		}
		if registry, err = sr.NewClient(sr.URLs(c.registryURL)); err != nil {
			return &cli.UsageError{Err: fmt.Errorf("%s: %w", cli.Named("schema-registry-url"), err)}
		}
	}
	enc, err := topics.Encoder(ctx, registry, spec)
	if err != nil {
		return fmt.Errorf("wire formats of the topic spec (register the schemas with `relay topics apply -schema-registry-url …`): %w", err)
	}

	var tokens *admin.Tokens
	if c.admin.Enabled {
		if tokens, err = admin.LoadTokens(c.admin.TokenFile); err != nil {
			return cli.Usagef("%s: %v", cli.Named("admin-token-file"), err)
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(horizon.NewCollector(pool, "relay", log))
	// The wall clock the records are stamped with: the host's, unless a
	// fault test skews it (ONCEFLOW_CLOCK_SKEW; internal/wallclock).
	clock, err := wallclock.FromEnv(os.Getenv)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	if clock.Skew() != 0 {
		log.WarnContext(ctx, "wall clock skewed for fault injection", slog.String("env", wallclock.EnvVar), slog.Duration("skew", clock.Skew()))
	}
	oc := c.outbox
	oc.Clock = clock.Now
	oc.DB = pool
	oc.Hooks = relayHooks()
	oc.KafkaOpts = c.kafka.Opts(log)
	oc.Logger = log
	oc.Registerer = reg
	oc.TopicCheck = topicCheck
	oc.Wire = enc
	oc.TracerProvider = tracing.Provider
	relay, err := relay.New(oc)
	if err != nil {
		return &cli.UsageError{Err: outboxError(err)}
	}
	log.InfoContext(ctx, "relay starting", slog.String("shard", c.outbox.Shard), slog.Int("shards", c.outbox.Shards), slog.String("http_addr", c.httpAddr))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := relay.Run(gctx); err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		err := httpserver.Serve(gctx, httpserver.Config{
			Addr: c.httpAddr, Gatherer: reg, Ready: relay.Ready, Detail: relay.Role, Logger: log,
		}, func(a net.Addr) {
			log.InfoContext(gctx, "http listening", slog.String("addr", a.String()))
		})
		if err != nil {
			return fmt.Errorf("http server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := pprofserver.Serve(gctx, c.pprofAddr, log, func(a net.Addr) {
			log.InfoContext(gctx, "pprof listening", slog.String("addr", a.String()))
		}); err != nil {
			return fmt.Errorf("pprof server: %w", err)
		}
		return nil
	})
	if c.admin.Enabled {
		h := admin.NewRelayHandler(pool, func() admin.RelaySelf { return admin.RelaySelf{Role: relay.Role()} }, tokens, log)
		g.Go(func() error {
			if err := admin.Serve(gctx, c.admin, h, log); err != nil {
				return fmt.Errorf("admin server: %w", err)
			}
			return nil
		})
	}
	err = g.Wait()
	log.InfoContext(context.WithoutCancel(ctx), "relay exiting", slog.Any("error", err))
	return err
}

// checkCheckpointTopic runs the start-time check of the checkpoint topic
// until it answers: a drift (or a topic that is missing) is final, but a
// failure to ask — a broker not up yet, a topic just created that has not
// reached every broker's metadata — is retried with backoff, logged, until
// ctx ends.
func checkCheckpointTopic(ctx context.Context, log *slog.Logger, maxWait time.Duration, check func() error) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = maxWait
	bo.MaxElapsedTime = 0
	return backoff.RetryNotify(func() error {
		err := check()
		if err == nil || errors.Is(err, topics.ErrDrift) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(bo, ctx), func(err error, wait time.Duration) {
		log.WarnContext(ctx, "checking the checkpoint topic failed; retrying",
			slog.Any("error", err), slog.String("retry_in", wait.String()))
	})
}
