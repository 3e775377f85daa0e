package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/kafkaconn"
	"github.com/onceflow/onceflow/internal/obs"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/pkg/envelope"
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
		return nil, fmt.Errorf("-log-format/-log-level (ONCEFLOW_LOG_FORMAT/ONCEFLOW_LOG_LEVEL): %v", err)
	}
	return l, nil
}

// runConfig is the configuration of `consumer run`.
type runConfig struct {
	Admin admin.Flags
	DB    pgconn.Config
	Kafka kafkaconn.Config
	Log   logConfig

	BatchMaxRecords      int
	ConsumerName         string
	DLQTopic             string
	FirstSeen            string
	GapCheckInterval     time.Duration
	GapTimeout           time.Duration
	GapTimeouts          string
	Group                string
	HandlersFile         string
	RetentionFile        string
	RetentionInterval    time.Duration
	HTTPAddr             string
	InstanceID           string
	LatePolicy           string
	MaxParked            int
	MaxPayloadBytes      int
	Ordering             string
	RetryInitialInterval time.Duration
	RetryMaxAttempts     int
	RetryMaxElapsed      time.Duration
	RetryMaxInterval     time.Duration
	SessionTimeout       time.Duration
	Topics               cli.List

	// Parsed by validate.
	firstSeen   seqguard.FirstSeen
	gapTimeouts []inbox.GapTimeout
	latePolicy  seqguard.Late
	ordering    inbox.Ordering
}

// RegisterFlags registers every flag of `consumer run`.
func (c *runConfig) RegisterFlags(fs *flag.FlagSet) {
	c.Admin.RegisterFlags(fs, defaultAdminAddr)
	c.DB.RegisterFlags(fs)
	c.Kafka.RegisterFlags(fs, "onceflow-consumer")
	c.Log.RegisterFlags(fs)
	fs.IntVar(&c.BatchMaxRecords, "batch-max-records", 500, "most records of one partition applied in one transaction")
	fs.StringVar(&c.ConsumerName, "consumer-name", inbox.DefaultConsumerName, "logical consumer name owning the inbox ledger")
	fs.StringVar(&c.DLQTopic, "dlq-topic", "", "topic that receives a copy of each dead-lettered record (optional)")
	fs.StringVar(&c.FirstSeen, "first-seen", seqguard.ExpectFirstSeq1.String(), "start policy for a source seen for the first time: expect-first-seq-1 or accept-first-seen")
	fs.DurationVar(&c.GapCheckInterval, "gap-check-interval", time.Second, "how often the gap timer gives up expired gaps and refreshes the guard gauges")
	fs.DurationVar(&c.GapTimeout, "gap-timeout", seqguard.DefaultGapTimeout, "how long a sequence gap stays open before it is given up")
	fs.StringVar(&c.GapTimeouts, "gap-timeouts", "", "gap timeouts per event-type class: comma-separated glob=duration, first match wins (e.g. billing.*=5m,agent.*=10s)")
	fs.StringVar(&c.Group, "group", "", "Kafka consumer group (required)")
	fs.StringVar(&c.HandlersFile, "handlers-file", "", "JSON file configuring the sql/log handlers per event type (required)")
	fs.DurationVar(&c.RetentionInterval, "retention-interval", 0, "with -retention-file: prune expired rows this often (0: never; use 'consumer prune' from a CronJob)")
	cli.Deprecated(fs, "prune-interval", "retention-interval")
	fs.StringVar(&c.RetentionFile, "retention-file", "", "JSON file of retention classes and sources' redelivery horizons, checked at start (see docs/effects.md)")
	fs.StringVar(&c.HTTPAddr, "http-addr", ":9464", "address of /metrics, /healthz and /readyz (empty disables)")
	fs.StringVar(&c.InstanceID, "instance-id", "", "static group membership id, stable per replica (e.g. the pod name); empty: dynamic")
	fs.StringVar(&c.LatePolicy, "late-policy", seqguard.DeliverLate.String(), "event arriving after its gap was given up: deliver-late (handler sees Late) or hold (kept for an operator)")
	fs.IntVar(&c.MaxParked, "max-parked", seqguard.DefaultMaxParked, "most parked events per source; beyond it the lowest gaps are given up early")
	fs.IntVar(&c.MaxPayloadBytes, "max-payload-bytes", envelope.DefaultMaxPayloadBytes, "largest payload accepted; bigger records are dead-lettered")
	fs.StringVar(&c.Ordering, "ordering", inbox.OrderSeq.String(), "per-source ordering: seq (sequence guard) or arrival")
	fs.DurationVar(&c.RetryInitialInterval, "retry-initial-interval", 100*time.Millisecond, "first backoff after a handler error")
	fs.IntVar(&c.RetryMaxAttempts, "retry-max-attempts", 5, "tries of a failing event before it is dead-lettered")
	fs.DurationVar(&c.RetryMaxElapsed, "retry-max-elapsed", 30*time.Second, "longest time spent retrying one event")
	fs.DurationVar(&c.RetryMaxInterval, "retry-max-interval", 5*time.Second, "longest backoff between tries")
	fs.DurationVar(&c.SessionTimeout, "session-timeout", 45*time.Second, "how long the group waits for a member that stopped heartbeating before reassigning its partitions (the broker allows 6s and up by default)")
	fs.Var(&c.Topics, "topics", "comma-separated topics to consume (required)")
}

func (c *runConfig) validate() error {
	errs := []error{c.DB.Validate(), c.Kafka.Validate(), c.Admin.Validate()}
	if c.Group == "" {
		errs = append(errs, errors.New("-group (ONCEFLOW_GROUP) is required"))
	}
	if len(c.Topics) == 0 {
		errs = append(errs, errors.New("-topics (ONCEFLOW_TOPICS) is required"))
	}
	if c.ConsumerName == "" {
		errs = append(errs, errors.New("-consumer-name (ONCEFLOW_CONSUMER_NAME) must not be empty"))
	}
	if c.HandlersFile == "" {
		errs = append(errs, errors.New("-handlers-file (ONCEFLOW_HANDLERS_FILE) is required"))
	}
	if c.BatchMaxRecords < 1 {
		errs = append(errs, fmt.Errorf("-batch-max-records (ONCEFLOW_BATCH_MAX_RECORDS) must be at least 1, got %d", c.BatchMaxRecords))
	}
	if c.MaxPayloadBytes < 1 {
		errs = append(errs, fmt.Errorf("-max-payload-bytes (ONCEFLOW_MAX_PAYLOAD_BYTES) must be at least 1, got %d", c.MaxPayloadBytes))
	}
	if c.RetryMaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("-retry-max-attempts (ONCEFLOW_RETRY_MAX_ATTEMPTS) must be at least 1, got %d", c.RetryMaxAttempts))
	}
	var err error
	if c.ordering, err = inbox.ParseOrdering(c.Ordering); err != nil {
		errs = append(errs, fmt.Errorf("-ordering (ONCEFLOW_ORDERING): %v", err))
	}
	if c.firstSeen, err = seqguard.ParseFirstSeen(c.FirstSeen); err != nil {
		errs = append(errs, fmt.Errorf("-first-seen (ONCEFLOW_FIRST_SEEN): %v", err))
	}
	if c.latePolicy, err = seqguard.ParseLate(c.LatePolicy); err != nil {
		errs = append(errs, fmt.Errorf("-late-policy (ONCEFLOW_LATE_POLICY): %v", err))
	}
	if c.gapTimeouts, err = inbox.ParseGapTimeouts(c.GapTimeouts); err != nil {
		errs = append(errs, fmt.Errorf("-gap-timeouts (ONCEFLOW_GAP_TIMEOUTS): %v", err))
	}
	if c.MaxParked < 1 {
		errs = append(errs, fmt.Errorf("-max-parked (ONCEFLOW_MAX_PARKED) must be at least 1, got %d", c.MaxParked))
	}
	errs = append(errs,
		cli.PositiveDuration("gap-check-interval", c.GapCheckInterval),
		cli.PositiveDuration("gap-timeout", c.GapTimeout),
		cli.PositiveDuration("retry-initial-interval", c.RetryInitialInterval),
		cli.PositiveDuration("retry-max-interval", c.RetryMaxInterval),
		cli.PositiveDuration("retry-max-elapsed", c.RetryMaxElapsed),
		cli.PositiveDuration("session-timeout", c.SessionTimeout),
	)
	for _, err := range errs {
		if err != nil {
			return err // one clear line: the first bad setting
		}
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
	FirstSeen   string
	GapTimeout  time.Duration
	GapTimeouts string
	MaxParked   int
}

// RegisterFlags registers the flags of the dlq commands; replay needs the
// handlers file and the sequence guard's settings too.
func (c *dlqConfig) RegisterFlags(fs *flag.FlagSet, replay bool) {
	c.DB.RegisterFlags(fs)
	c.Log.RegisterFlags(fs)
	c.Filter.RegisterFlags(fs)
	fs.StringVar(&c.ConsumerName, "consumer-name", inbox.DefaultConsumerName, "logical consumer name owning the inbox ledger")
	if !replay {
		fs.IntVar(&c.Limit, "limit", 100, "most rows (or groups) to list")
		fs.StringVar(&c.GroupBy, "group-by", "", "error: one line per error group (errors alike but for numbers and ids), biggest first")
		return
	}
	fs.StringVar(&c.FirstSeen, "first-seen", seqguard.ExpectFirstSeq1.String(), "as the consumer's -first-seen")
	fs.DurationVar(&c.GapTimeout, "gap-timeout", seqguard.DefaultGapTimeout, "as the consumer's -gap-timeout: the timeout of a gap a replayed event opens")
	fs.StringVar(&c.GapTimeouts, "gap-timeouts", "", "as the consumer's -gap-timeouts (glob=duration,…)")
	fs.IntVar(&c.MaxParked, "max-parked", seqguard.DefaultMaxParked, "as the consumer's -max-parked")
	fs.StringVar(&c.HandlersFile, "handlers-file", "", "JSON file configuring the handlers (required)")
	fs.IntVar(&c.Limit, "limit", admin.DefaultReplayLimit, "most events one replay applies (the rest are reported as remaining)")
	fs.StringVar(&c.Actor, "actor", "", "who replays, for the audit (default: the OS user)")
	fs.BoolVar(&c.All, "all", false, "replay every dead and held event (instead of EVENT-ID or a filter)")
	fs.BoolVar(&c.DryRun, "dry-run", false, "count and list what would be replayed; change nothing")
	fs.IntVar(&c.Expect, "expect", -1, "refuse unless exactly this many events match (the count a -dry-run showed)")
	fs.StringVar(&c.Note, "note", "", "why, for the audit (required to replay more than one event)")
	fs.StringVar(&c.RequestID, "request-id", "", "id of this change: a retry with the same id is not applied twice (default: a new random id)")
}

// replayConfig checks the replay flags and returns the library's config.
func (c *dlqConfig) replayConfig() (inbox.ReplayConfig, error) {
	rc := inbox.ReplayConfig{ConsumerName: c.ConsumerName, GapTimeout: c.GapTimeout, MaxParked: c.MaxParked}
	var err error
	if rc.FirstSeen, err = seqguard.ParseFirstSeen(c.FirstSeen); err != nil {
		return rc, fmt.Errorf("-first-seen (ONCEFLOW_FIRST_SEEN): %v", err)
	}
	if rc.GapTimeouts, err = inbox.ParseGapTimeouts(c.GapTimeouts); err != nil {
		return rc, fmt.Errorf("-gap-timeouts (ONCEFLOW_GAP_TIMEOUTS): %v", err)
	}
	if err := cli.PositiveDuration("gap-timeout", c.GapTimeout); err != nil {
		return rc, err
	}
	if c.MaxParked < 1 {
		return rc, fmt.Errorf("-max-parked (ONCEFLOW_MAX_PARKED) must be at least 1, got %d", c.MaxParked)
	}
	return rc, nil
}
