package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/kafkaconn"
	"github.com/onceflow/onceflow/internal/obs"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// logConfig is shared by every command.
type logConfig struct {
	Format string
	Level  string
}

func (c *logConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Format, "log-format", "json", "log format: json or text")
	fs.StringVar(&c.Level, "log-level", "info", "log level: debug, info, warn or error")
}

func (c *logConfig) logger(w io.Writer) (*slog.Logger, error) {
	l, err := obs.NewLogger(w, c.Format, c.Level)
	if err != nil {
		return nil, fmt.Errorf("%s / %s: %v", cli.Named("log-format"), cli.Named("log-level"), err)
	}
	return l, nil
}

// runConfig is the configuration of `consumer run`. The engine's settings
// are flags bound straight onto inbox.Config, with the library's defaults;
// the library's Validate is their only check.
type runConfig struct {
	Admin admin.Flags
	DB    pgconn.Config
	Kafka kafkaconn.Config
	Log   logConfig
	Inbox inbox.Config

	HandlersFile      string
	HTTPAddr          string
	PprofAddr         string
	RetentionFile     string
	RetentionInterval time.Duration
	SchemaRegistryURL string
}

// inboxFlags is the flag of each inbox.Config (and inbox.ReplayConfig)
// field the consumer's commands set: an invalid value is reported by its
// flag and environment variable.
var inboxFlags = cli.Fields{
	"BatchMaxRecords":        "batch-max-records",
	"Concurrency":            "concurrency",
	"ConsumerName":           "consumer-name",
	"DLQTopic":               "dlq-topic",
	"FetchMaxBytes":          "fetch-max-bytes",
	"FetchMaxPartitionBytes": "fetch-max-partition-bytes",
	"FetchMaxWait":           "fetch-max-wait",
	"FirstSeen":              "first-seen",
	"GapCheckInterval":       "gap-check-interval",
	"GapTimeout":             "gap-timeout",
	"GapTimeouts":            "gap-timeouts",
	"Group":                  "group",
	"InstanceID":             "instance-id",
	"LatePolicy":             "late-policy",
	"MaxParked":              "max-parked",
	"MaxPayloadBytes":        "max-payload-bytes",
	"Ordering":               "ordering",
	"RetryInitialInterval":   "retry-initial-interval",
	"RetryMaxAttempts":       "retry-max-attempts",
	"RetryMaxElapsed":        "retry-max-elapsed",
	"RetryMaxInterval":       "retry-max-interval",
	"SealedFilterMaxBytes":   "sealed-filter-max-bytes",
	"SessionTimeout":         "session-timeout",
	"StartAt":                "start-at",
	"Topics":                 "topics",
}

// inboxUnflagged are the inbox.Config settings the binary leaves at the
// library's defaults (no flag).
var inboxUnflagged = []string{"BatchTimeout", "CommitInterval", "CommitTimeout", "QueueDepth",
	"SchemaRegistry"} // built from -schema-registry-url

// inboxError reports an inbox.Config or ReplayConfig error by flag.
func inboxError(err error) error {
	var ce *inbox.ConfigError
	if errors.As(err, &ce) {
		return inboxFlags.Error("inbox config", ce.Field, ce.Reason)
	}
	return err
}

// Help texts of the flags several commands share: one environment name,
// one meaning, one text.
const (
	consumerNameHelp  = "logical consumer name: the inbox ledger, effects and gaps this command works on (other consumers' rows are never touched)"
	handlersFileHelp  = "JSON file configuring the handlers per event type (required)"
	retentionFileHelp = "JSON file of retention classes and sources' redelivery horizons, checked at start (see docs/effects.md); `consumer prune` needs it"
)

// registerGuardFlags registers the sequence guard's settings, shared by
// `consumer run` and `consumer dlq replay` (a replay goes through the guard
// with the consumer's settings).
func registerGuardFlags(fs *flag.FlagSet, firstSeen *seqguard.FirstSeen, gapTimeout *time.Duration, gapTimeouts *[]inbox.GapTimeout, maxParked *int) {
	*firstSeen = seqguard.ExpectFirstSeq1
	cli.Var(fs, firstSeen, "first-seen", "start policy for a source seen for the first time: expect-first-seq-1 or accept-first-seen",
		seqguard.ParseFirstSeen, seqguard.FirstSeen.String)
	fs.DurationVar(gapTimeout, "gap-timeout", inbox.DefaultGapTimeout, "how long a sequence gap stays open before it is given up")
	cli.Var(fs, gapTimeouts, "gap-timeouts", "gap timeouts per event-type class: comma-separated glob=duration, first match wins (e.g. billing.*=5m,agent.*=10s)",
		inbox.ParseGapTimeouts, formatGapTimeouts)
	fs.IntVar(maxParked, "max-parked", inbox.DefaultMaxParked, "most parked events per source; beyond it the lowest gaps are given up early")
}

func formatGapTimeouts(rules []inbox.GapTimeout) string {
	parts := make([]string, len(rules))
	for i, r := range rules {
		parts[i] = r.Pattern + "=" + r.Timeout.String()
	}
	return strings.Join(parts, ",")
}

// RegisterFlags registers every flag of `consumer run`.
func (c *runConfig) RegisterFlags(fs *flag.FlagSet) {
	c.Admin.RegisterFlags(fs, defaultAdminAddr)
	c.DB.RegisterFlags(fs)
	c.Kafka.RegisterFlags(fs, "onceflow-consumer")
	c.Log.RegisterFlags(fs)
	o := &c.Inbox
	o.BatchTimeout, o.CommitInterval, o.CommitTimeout, o.QueueDepth = inbox.DefaultBatchTimeout, inbox.DefaultCommitInterval, inbox.DefaultCommitTimeout, inbox.DefaultQueueDepth
	fs.IntVar(&o.BatchMaxRecords, "batch-max-records", inbox.DefaultBatchMaxRecords, "most records of one partition applied in one transaction")
	fs.IntVar(&o.Concurrency, "concurrency", inbox.DefaultConcurrency, "how many streams of one partition may have their http calls in flight at once (each stream's in seq order; the calls hold no database connection, and each batch still commits in one transaction)")
	fs.StringVar(&o.ConsumerName, "consumer-name", inbox.DefaultConsumerName, consumerNameHelp)
	fs.StringVar(&o.DLQTopic, "dlq-topic", "", "topic that receives a copy of each dead-lettered record (optional)")
	cli.Int32Var(fs, &o.FetchMaxBytes, "fetch-max-bytes", inbox.DefaultFetchMaxBytes, "most bytes (compressed, as stored) one fetch from a broker brings; with -fetch-max-partition-bytes, -batch-max-records and the queue depth it bounds memory")
	fs.DurationVar(&o.FetchMaxWait, "fetch-max-wait", inbox.DefaultFetchMaxWait, "longest a broker holds a fetch that finds nothing new (a transaction's commit ends the wait; this bounds when a partition resumed after a pause is fetched again, and the idle requests)")
	cli.Int32Var(fs, &o.FetchMaxPartitionBytes, "fetch-max-partition-bytes", inbox.DefaultFetchMaxPartitionBytes, "most bytes of one partition in one fetch (a broker still returns at least one record batch)")
	fs.DurationVar(&o.GapCheckInterval, "gap-check-interval", inbox.DefaultGapCheckInterval, "how often the gap timer gives up expired gaps and refreshes the guard gauges")
	registerGuardFlags(fs, &o.FirstSeen, &o.GapTimeout, &o.GapTimeouts, &o.MaxParked)
	fs.StringVar(&o.Group, "group", "", "Kafka consumer group (required)")
	fs.StringVar(&c.HandlersFile, "handlers-file", "", handlersFileHelp)
	fs.DurationVar(&c.RetentionInterval, "retention-interval", 0, "with -retention-file: prune expired rows this often (0: never; use 'consumer prune' from a CronJob)")
	cli.Deprecated(fs, "prune-interval", "retention-interval")
	fs.StringVar(&c.RetentionFile, "retention-file", "", retentionFileHelp)
	fs.StringVar(&c.HTTPAddr, "http-addr", ":9464", "address of /metrics, /healthz and /readyz (empty disables)")
	fs.StringVar(&c.PprofAddr, "pprof-addr", "", "address of Go's /debug/pprof profiles, e.g. 127.0.0.1:6060 (empty, the default, disables)")
	fs.StringVar(&o.InstanceID, "instance-id", "", "static group membership id, stable per replica (e.g. the pod name); empty: dynamic")
	o.LatePolicy = seqguard.DeliverLate
	cli.Var(fs, &o.LatePolicy, "late-policy", "event arriving after its gap was given up: deliver-late (handler sees Late) or hold (kept for an operator)",
		seqguard.ParseLate, seqguard.Late.String)
	fs.IntVar(&o.MaxPayloadBytes, "max-payload-bytes", inbox.DefaultMaxPayloadBytes, "largest payload accepted; bigger records are dead-lettered")
	o.Ordering = inbox.OrderSeq
	cli.Var(fs, &o.Ordering, "ordering", "per-source ordering: seq (sequence guard) or arrival", inbox.ParseOrdering, inbox.Ordering.String)
	fs.DurationVar(&o.RetryInitialInterval, "retry-initial-interval", inbox.DefaultRetryInitialInterval, "first backoff after a handler error")
	fs.IntVar(&o.RetryMaxAttempts, "retry-max-attempts", inbox.DefaultRetryMaxAttempts, "tries of a failing event before it is dead-lettered")
	fs.DurationVar(&o.RetryMaxElapsed, "retry-max-elapsed", inbox.DefaultRetryMaxElapsed, "longest time spent retrying one event")
	fs.DurationVar(&o.RetryMaxInterval, "retry-max-interval", inbox.DefaultRetryMaxInterval, "longest backoff between tries")
	fs.StringVar(&c.SchemaRegistryURL, "schema-registry-url", "", cli.SchemaRegistryHelp)
	fs.IntVar(&o.SealedFilterMaxBytes, "sealed-filter-max-bytes", inbox.DefaultSealedFilterMaxBytes, "most memory the filters of the inbox's sealed buckets take in this process (1.25 MB per million ids of the producers' own); past it the smallest are kept and the other sealed buckets probed as if not sealed (slower, still exactly once)")
	fs.DurationVar(&o.SessionTimeout, "session-timeout", inbox.DefaultSessionTimeout, "how long the group waits for a member that stopped heartbeating before reassigning its partitions (the broker allows 6s and up by default)")
	cli.Var(fs, &o.StartAt, "start-at", "where a partition with no stored offset starts (a new group, a new or recreated topic): earliest (the whole retained log), latest, or an RFC 3339 time; other than earliest needs -first-seen accept-first-seen",
		inbox.ParseStartPosition, inbox.StartPosition.String)
	fs.Var((*cli.List)(&o.Topics), "topics", "comma-separated topics to consume (required)")
}

func (c *runConfig) validate() error {
	for _, err := range []error{c.DB.Validate(), c.Kafka.Validate(), c.Admin.Validate(), inboxError(c.Inbox.Validate())} {
		if err != nil {
			return err // one clear line: the first bad setting
		}
	}
	if c.HandlersFile == "" {
		return fmt.Errorf("%s is required", cli.Named("handlers-file"))
	}
	return nil
}

// defaultAdminAddr is where -admin listens unless told otherwise: loopback
// only.
const defaultAdminAddr = "127.0.0.1:9091"

// dlqConfig is the configuration of `consumer dlq …`.
type dlqConfig struct {
	DB           pgconn.Config
	Log          logConfig
	ConsumerName string
	// Filter selects rows (list and replay alike).
	Filter  admin.FilterParams
	GroupBy string
	Limit   int
	// Replay only.
	Actor        string
	All          bool
	DryRun       bool
	Expect       int
	HandlersFile string
	Note         string
	RequestID    string

	// Replay goes through the sequence guard with the consumer's settings.
	Replay inbox.ReplayConfig
}

// RegisterFlags registers the flags of the dlq commands; replay needs the
// handlers file and the sequence guard's settings too.
func (c *dlqConfig) RegisterFlags(fs *flag.FlagSet, replay bool) {
	c.DB.RegisterFlags(fs)
	c.Log.RegisterFlags(fs)
	c.Filter.RegisterFlags(fs)
	fs.StringVar(&c.ConsumerName, "consumer-name", inbox.DefaultConsumerName, consumerNameHelp)
	if !replay {
		fs.IntVar(&c.Limit, "limit", 100, "most rows (or groups) to list")
		fs.StringVar(&c.GroupBy, "group-by", "", "error: one line per error group (errors alike but for numbers and ids), biggest first")
		cli.Local(fs, append(admin.FilterFlags, "limit", "group-by")...)
		return
	}
	r := &c.Replay
	registerGuardFlags(fs, &r.FirstSeen, &r.GapTimeout, &r.GapTimeouts, &r.MaxParked)
	fs.StringVar(&c.HandlersFile, "handlers-file", "", handlersFileHelp)
	fs.IntVar(&c.Limit, "limit", admin.DefaultReplayLimit, "most events one replay applies (the rest are reported as remaining)")
	fs.StringVar(&c.Actor, "actor", "", "who replays, for the audit (default: the OS user)")
	fs.BoolVar(&c.All, "all", false, "replay every dead and held event (instead of EVENT-ID or a filter)")
	fs.BoolVar(&c.DryRun, "dry-run", false, "count and list what would be replayed; change nothing")
	fs.IntVar(&c.Expect, "expect", -1, "refuse unless exactly this many events match (the count a -dry-run showed)")
	fs.StringVar(&c.Note, "note", "", "why, for the audit (required to replay more than one event)")
	fs.StringVar(&c.RequestID, "request-id", "", "id of this change: a retry with the same id is not applied twice (default: a new random id)")
	cli.Local(fs, append(admin.FilterFlags, "limit", "actor", "all", "dry-run", "expect", "note", "request-id")...)
}

// replayConfig checks the replay flags and returns the library's config.
func (c *dlqConfig) replayConfig() (inbox.ReplayConfig, error) {
	rc := c.Replay
	rc.ConsumerName = c.ConsumerName
	return rc, inboxError(rc.Validate())
}
