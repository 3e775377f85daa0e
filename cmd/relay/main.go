// Command relay publishes onceflow's PostgreSQL outbox to Kafka.
//
//	relay run      [flags]   publish (one leader per shard, the others stand by)
//	relay migrate  [flags]   apply the schema migrations
//	relay topics verify|apply [flags]   check or create the topics of contract/topics.json
//	relay identity show|adopt|reset|legacy …   this database's identity (see admin.go)
//	relay outbox failed list|retry|skip …       rows set aside because Kafka refuses them
//
// `relay run -admin` also serves the relay's status as JSON
// (GET /api/v1/relay, bearer token; docs/console.md).
//
// Every flag has an ONCEFLOW_* environment fallback (-database-url is
// ONCEFLOW_DATABASE_URL); flags win. See docs/relay.md.
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
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/httpserver"
	"github.com/onceflow/onceflow/internal/kafkaconn"
	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/obs"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/internal/pprofserver"
	"github.com/onceflow/onceflow/internal/topics"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// exitUsage is the exit code of invalid configuration.
const exitUsage = 2

type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(exitUsage)
	default:
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

const usage = `usage: relay run [flags] | relay migrate [flags] | relay topics verify|apply [flags] | relay help
       relay identity show|adopt|reset|legacy … | relay outbox failed list|retry|skip …

Tracing: the standard OpenTelemetry variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...); off when none is set. See docs/tracing.md.
`

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{errors.New("a subcommand is required")}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch args[0] {
	case "run":
		return runRelay(ctx, args[1:], stderr)
	case "migrate":
		log, err := obs.NewLogger(stderr, os.Getenv(cli.EnvName("log-format")), os.Getenv(cli.EnvName("log-level")))
		if err != nil {
			return usageError{err}
		}
		if err := migrate.Command(ctx, "relay", args[1:], stdout, log); err != nil {
			return usageError{err}
		}
		return nil
	case "topics":
		log, err := obs.NewLogger(stderr, os.Getenv(cli.EnvName("log-format")), os.Getenv(cli.EnvName("log-level")))
		if err != nil {
			return usageError{err}
		}
		// Drift exits 1; bad flags and unreachable brokers exit 2, like migrate.
		err = topics.Command(ctx, "relay", args[1:], stdout, log)
		if err != nil && !errors.Is(err, topics.ErrDrift) {
			return usageError{err}
		}
		return err
	case "identity", "outbox":
		return runAdmin(ctx, args, stdout)
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
		return usageError{fmt.Errorf("unknown subcommand %q", args[0])}
	}
}

// Help texts of the flags `relay run` shares with the operator commands:
// one environment name, one meaning, one text.
const (
	shardHelp       = "relay shard: lease row, transactional.id suffix, checkpoint key suffix; with -shards N over 1, the shard's index 0..N-1"
	txnIDPrefixHelp = "Kafka transactional.id prefix, the shard is appended; must be unique to this database on the Kafka cluster (empty: onceflow-relay-<database identity>-, unique by construction)"
)

// config is everything `relay run` is configured with.
type config struct {
	admin     admin.Flags
	db        pgconn.Config
	kafka     kafkaconn.Config
	httpAddr  string
	pprofAddr string
	logFormat string
	logLevel  string

	backoffMax      time.Duration
	batchMaxBytes   int
	batchMaxRows    int
	checkpointTopic string
	deleteOnPublish bool
	holderID        string
	leaseRenew      time.Duration
	listen          bool
	leaseTTL        time.Duration
	pollInterval    time.Duration
	pruneBatchRows  int
	pruneInterval   time.Duration
	retention       time.Duration
	retrySetAside   time.Duration
	shard           string
	shards          int
	standbyInterval time.Duration
	txnIDPrefix     string
	txnTimeout      time.Duration

	topicsVerify bool
	topics       topics.Config
}

// RegisterFlags registers the flags of `relay run`.
func (c *config) RegisterFlags(fs *flag.FlagSet) {
	c.admin.RegisterFlags(fs, "127.0.0.1:9092")
	c.db.RegisterFlags(fs)
	c.kafka.RegisterFlags(fs, "onceflow-relay")
	fs.StringVar(&c.httpAddr, "http-addr", ":9090", "address of /metrics, /healthz and /readyz (empty disables)")
	fs.StringVar(&c.pprofAddr, "pprof-addr", "", "address of Go's /debug/pprof profiles, e.g. 127.0.0.1:6060 (empty, the default, disables)")
	fs.StringVar(&c.logFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&c.backoffMax, "backoff-max", 5*time.Second, "longest wait between retries of Kafka and PostgreSQL errors")
	fs.IntVar(&c.batchMaxBytes, "batch-max-bytes", 4<<20, "maximum payload bytes per Kafka transaction")
	fs.IntVar(&c.batchMaxRows, "batch-max-rows", 1000, "maximum rows per Kafka transaction")
	fs.StringVar(&c.checkpointTopic, "checkpoint-topic", "onceflow.relay.checkpoints", "compacted topic for the relay's checkpoints (created if missing)")
	fs.BoolVar(&c.deleteOnPublish, "delete-on-publish", false, "delete rows once published instead of keeping them for -retention (about 2x drain throughput)")
	fs.StringVar(&c.holderID, "holder-id", "", "this process's name in the lease table; stable across restarts, unique among live relays (default hostname-pid-random)")
	fs.DurationVar(&c.leaseRenew, "lease-renew-interval", time.Second, "how often the leader renews its lease")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", 3*time.Second, "lease lifetime without renewal (takeover time after a leader dies)")
	fs.BoolVar(&c.listen, "listen", false, "also wake on NOTIFY onceflow_outbox (enable the trigger onceflow.outbox_notify for producers to notify)")
	fs.DurationVar(&c.pollInterval, "poll-interval", 20*time.Millisecond, "wait between polls of an empty outbox")
	fs.IntVar(&c.pruneBatchRows, "prune-batch-rows", 1000, "published rows deleted per prune statement")
	fs.DurationVar(&c.pruneInterval, "prune-interval", time.Second, "how often published rows are pruned")
	fs.DurationVar(&c.retention, "retention", time.Hour, "how long published rows are kept (negative: delete at the next prune)")
	fs.DurationVar(&c.retrySetAside, "retry-set-aside-after", 30*time.Second, "first automatic retry of a row set aside for a missing topic, ACL or topic contract (doubles per refusal, up to 10m); rows refused for their content wait for `relay outbox failed retry|skip`")
	fs.StringVar(&c.shard, "shard", "default", shardHelp)
	fs.IntVar(&c.shards, "shards", 1, "how many shards split the database's sources, each with its own leader; with more than 1, -shard is this relay's index 0..shards-1 (docs/relay.md, \"Shards\")")
	fs.DurationVar(&c.standbyInterval, "standby-interval", 500*time.Millisecond, "how often a standby tries to take the lease")
	fs.StringVar(&c.txnIDPrefix, "transactional-id-prefix", "", txnIDPrefixHelp)
	fs.DurationVar(&c.txnTimeout, "transaction-timeout", 10*time.Second, "Kafka transaction timeout")
	fs.BoolVar(&c.topicsVerify, "topics-verify", false, "verify the checkpoint topic at start and each event topic before its first publish against the topic spec; refuse to publish to a topic that breaks it (create topics with `relay topics apply` first)")
	c.topics.RegisterFlags(fs)
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
	for name, d := range map[string]time.Duration{
		"backoff-max": c.backoffMax, "lease-renew-interval": c.leaseRenew, "lease-ttl": c.leaseTTL, "poll-interval": c.pollInterval,
		"prune-interval": c.pruneInterval, "standby-interval": c.standbyInterval, "transaction-timeout": c.txnTimeout,
		"retry-set-aside-after": c.retrySetAside,
	} {
		if err := cli.PositiveDuration(name, d); err != nil {
			return err
		}
	}
	positive := func(name string, v int) error {
		if v < 1 {
			return fmt.Errorf("-%s (%s) must be at least 1, got %d", name, cli.EnvName(name), v)
		}
		return nil
	}
	if err := errors.Join(positive("batch-max-rows", c.batchMaxRows), positive("batch-max-bytes", c.batchMaxBytes),
		positive("prune-batch-rows", c.pruneBatchRows)); err != nil {
		return err
	}
	if c.leaseRenew*2 > c.leaseTTL {
		return fmt.Errorf("-lease-renew-interval (%s) must be at most half of -lease-ttl (%s)", c.leaseRenew, c.leaseTTL)
	}
	if c.txnTimeout < time.Second {
		return fmt.Errorf("-transaction-timeout (%s) must be at least 1s, got %s", cli.EnvName("transaction-timeout"), c.txnTimeout)
	}
	if c.checkpointTopic == "" {
		return fmt.Errorf("-checkpoint-topic (%s) must not be empty", cli.EnvName("checkpoint-topic"))
	}
	if c.shard == "" {
		return fmt.Errorf("-shard (%s) must not be empty", cli.EnvName("shard"))
	}
	if c.shards < 1 {
		return fmt.Errorf("-shards (%s) must be at least 1, got %d", cli.EnvName("shards"), c.shards)
	}
	if k, err := strconv.Atoi(c.shard); c.shards > 1 && (err != nil || k < 0 || k >= c.shards || strconv.Itoa(k) != c.shard) {
		return fmt.Errorf("-shard (%s) must be this relay's shard index, 0 <= K < -shards (%d), when -shards is over 1; got %q", cli.EnvName("shard"), c.shards, c.shard)
	}
	return nil
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
		return usageError{err}
	}
	if err := c.validate(); err != nil {
		return usageError{err}
	}
	log, err := obs.NewLogger(stderr, c.logFormat, c.logLevel)
	if err != nil {
		return usageError{fmt.Errorf("-log-format/-log-level: %v", err)}
	}
	tracing, err := obs.NewTracing(ctx, "onceflow-relay", log, os.Getenv)
	if err != nil {
		return usageError{err}
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
			return usageError{err}
		}
		if err := c.topics.CheckTopics(ctx, adm, c.checkpointTopic); err != nil {
			return fmt.Errorf("checkpoint topic breaks the topic spec (run `relay topics apply`): %w", err)
		}
		topicCheck = func(ctx context.Context, topic string) error {
			err := c.topics.CheckTopics(ctx, adm, topic)
			if errors.Is(err, topics.ErrDrift) {
				return fmt.Errorf("%w: %w", outbox.ErrTopicRefused, err)
			}
			return err
		}
	}

	var tokens *admin.Tokens
	if c.admin.Enabled {
		if tokens, err = admin.LoadTokens(c.admin.TokenFile); err != nil {
			return usageError{fmt.Errorf("-admin-token-file (%s): %v", cli.EnvName("admin-token-file"), err)}
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	relay, err := outbox.New(outbox.Config{
		BackoffMax:            c.backoffMax,
		BatchMaxBytes:         c.batchMaxBytes,
		BatchMaxRows:          c.batchMaxRows,
		CheckpointTopic:       c.checkpointTopic,
		DB:                    pool,
		DeleteOnPublish:       c.deleteOnPublish,
		HolderID:              c.holderID,
		Hooks:                 relayHooks(),
		KafkaOpts:             c.kafka.Opts(log),
		LeaseRenewInterval:    c.leaseRenew,
		LeaseTTL:              c.leaseTTL,
		Listen:                c.listen,
		Logger:                log,
		PollInterval:          c.pollInterval,
		PruneBatchRows:        c.pruneBatchRows,
		PruneInterval:         c.pruneInterval,
		Registerer:            reg,
		Retention:             c.retention,
		RetrySetAsideAfter:    c.retrySetAside,
		Shard:                 c.shard,
		Shards:                c.shards,
		StandbyInterval:       c.standbyInterval,
		TopicCheck:            topicCheck,
		TracerProvider:        tracing.Provider,
		TransactionTimeout:    c.txnTimeout,
		TransactionalIDPrefix: c.txnIDPrefix,
	})
	if err != nil {
		return usageError{err}
	}
	log.InfoContext(ctx, "relay starting", slog.String("shard", c.shard), slog.Int("shards", c.shards), slog.String("http_addr", c.httpAddr))

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
			if err := admin.Serve(gctx, c.admin.Addr, h, log); err != nil {
				return fmt.Errorf("admin server: %w", err)
			}
			return nil
		})
	}
	err = g.Wait()
	log.InfoContext(context.WithoutCancel(ctx), "relay exiting", slog.Any("error", err))
	return err
}
