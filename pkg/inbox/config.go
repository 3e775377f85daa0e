package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// DefaultConsumerName is the logical consumer name when none is configured.
const DefaultConsumerName = "default"

// Config configures a Consumer. Fields are alphabetical; each documents its
// default. Pass it through WithDefaults (New does) before use.
type Config struct {
	// BatchHandler applies the events of a batch at once. Exactly one of
	// Handler and BatchHandler is required.
	BatchHandler BatchHandler

	// BatchMaxRecords caps how many records of one partition are applied in
	// one Postgres transaction (default 500). A larger fetch is split.
	BatchMaxRecords int

	// BatchTimeout bounds one batch transaction, handler included
	// (default 1m).
	BatchTimeout time.Duration

	// Clock is this replica's clock (default time.Now), for what is
	// measured on the replica (timestamps it passes along). Nothing that
	// decides when a gap is given up reads it: gap deadlines and give-ups
	// are on the database's clock, so a replica whose clock is off by
	// minutes gives gaps up neither early nor late. Tests skew it.
	Clock func() time.Time

	// CommitInterval is how often the offsets of batches committed in
	// Postgres are committed to Kafka (default 1s); they are also committed
	// when partitions are revoked. Kafka's own auto-commit of polled
	// offsets is never used.
	CommitInterval time.Duration

	// CommitTimeout bounds one Kafka offset commit (default 10s). A failed
	// commit is logged and harmless: the next offset is also in Postgres.
	CommitTimeout time.Duration

	// Concurrency is how many streams of one partition may have their
	// external effects made at the same time (default 1: one at a time, as
	// a handler without an effect phase runs). It applies to a handler that
	// implements Effecter (the handler file's http handler does): before a
	// batch's transaction, the effects of the events the guard will apply in
	// order are made, each stream's one after another in seq order and up to
	// Concurrency streams at a time, holding no transaction or connection;
	// the batch's transaction then records them. Handlers without an effect
	// phase are not affected (their batch is one transaction, as before).
	// At most MaxConcurrency.
	Concurrency int

	// ConsumerName is the logical consumer the inbox ledger belongs to
	// (default "default"). Deployments that must each apply every event use
	// different names; replicas or groups sharing a name dedup against each
	// other.
	ConsumerName string

	// DLQTopic, when set, receives a copy of every dead-lettered record with
	// the reason in the "onceflow-error" header (default: none). The inbox
	// row is the record of truth; the copy is best effort.
	DLQTopic string

	// FetchMaxBytes bounds one fetch response from a broker (default
	// 1 MiB), and FetchMaxPartitionBytes one partition's share of it
	// (default 256 KiB). Both count compressed bytes as the broker stores
	// them, and a broker returns at least one whole record batch. The
	// client buffers one fetch per broker; with QueueDepth and
	// BatchMaxRecords they bound the consumer's memory whatever the
	// backlog (docs/performance.md measures it).
	FetchMaxBytes          int32
	FetchMaxPartitionBytes int32

	// FetchMaxWait is how long a broker holds a fetch that finds nothing
	// new (default 50ms). It does not delay arriving events: the broker
	// answers a waiting read_committed fetch as soon as a transaction's
	// commit marker makes records visible. It bounds how long a partition
	// whose fetching resumes after a pause (QueueDepth) waits for the fetch
	// in flight to return before it is fetched again, and each idle wait
	// costs one small request (docs/performance.md measures the idle CPU).
	FetchMaxWait time.Duration

	// FirstSeen is the sequence guard's start policy for a source seen for
	// the first time (default seqguard.ExpectFirstSeq1: a first event with
	// seq 5 is parked behind the gap 1–4; seqguard.AcceptFirstSeen starts
	// the source at whatever arrives first). Only with OrderSeq.
	FirstSeen seqguard.FirstSeen

	// GapCheckInterval is how often the gap timer gives up expired gaps and
	// refreshes the guard gauges (default 1s). Every replica runs it; each
	// gap is given up once. Only with OrderSeq.
	GapCheckInterval time.Duration

	// GapTimeout is how long a sequence gap stays open before it is given
	// up and the events parked behind it are applied without the missing
	// ones (default 30s). GapTimeouts can override it per event-type class.
	// Only with OrderSeq.
	GapTimeout time.Duration

	// GapTimeouts are per event-type class gap timeouts: the first rule
	// whose glob matches the type of the event that opens a gap gives the
	// gap's timeout; GapTimeout applies when none matches (default: none).
	GapTimeouts []GapTimeout

	// Group is the Kafka consumer group (required).
	Group string

	// Handler applies one event. Exactly one of Handler and BatchHandler is
	// required.
	Handler Handler

	// Hooks are called at the points of the apply path where a crash
	// matters (default: none). Fault tests install them to kill the process
	// there; see Hooks.
	Hooks Hooks

	// InstanceID, when set, makes this member a static group member
	// (KIP-345): a restarted process with the same id takes its partitions
	// back at once instead of waiting for the session timeout, and a clean
	// shutdown does not leave the group (default: dynamic membership). Give
	// each replica its own stable id, e.g. the StatefulSet pod name.
	InstanceID string

	// KafkaOpts are the client options for connecting (seed brokers, TLS,
	// SASL, logger) (required: at least kgo.SeedBrokers). The consumer adds
	// the group, topics, balancer, isolation level and callbacks itself.
	KafkaOpts []kgo.Opt

	// LatePolicy is what happens to an event whose seq is at or below its
	// source's last applied seq although the inbox never saw it (it came
	// after its gap was given up): seqguard.DeliverLate (default) runs the
	// handler with Event.Late set; seqguard.Hold keeps it with status
	// 'held' for an operator (`consumer dlq list` / `dlq replay`). Counted
	// either way. Only with OrderSeq.
	LatePolicy seqguard.Late

	// Logger receives the consumer's logs (default: slog.Default(), so that
	// an embedded consumer's given-up gaps and dead letters are logged at
	// ERROR where the program logs; to silence it, pass
	// slog.New(slog.DiscardHandler)).
	Logger *slog.Logger

	// MaxParked bounds the parked events of one source (default 1000). When
	// parking one more would exceed it, the source's lowest open gaps are
	// given up early (reason max_parked). Only with OrderSeq.
	MaxParked int

	// MaxPayloadBytes is the largest payload accepted; bigger records are
	// dead-lettered as malformed (default envelope.DefaultMaxPayloadBytes).
	MaxPayloadBytes int

	// OnDeadLetter, OnGapGivenUp and OnLate are told, after the Postgres
	// commit that made it durable, of each event dead-lettered (a malformed
	// record, or a handler failing until the retries are exhausted), each
	// sequence gap given up, and each late event (delivered marked late or,
	// under seqguard.Hold, held) (default: none). Each fact is told once, by
	// the replica that committed it, never for an attempt that rolled back.
	// They run on the goroutine that committed
	// (a partition's worker or the gap timer), so they must be quick: a slow
	// one stalls that partition; hand slow work (paging, HTTP) to a
	// goroutine of your own. A panic in one is recovered and logged.
	OnDeadLetter func(ctx context.Context, info DeadLettered)
	OnGapGivenUp func(ctx context.Context, info GapGivenUp)
	OnLate       func(ctx context.Context, info LateEvent)

	// Ordering is how each source's events are ordered (default OrderSeq:
	// seq order through the sequence guard; OrderArrival: as they arrive).
	Ordering Ordering

	// Pool is the Postgres pool holding onceflow.inbox (required).
	Pool *pgxpool.Pool

	// QueueDepth is how many fetched batches may wait for one partition's
	// worker before fetching that partition is paused (default 2). Polling
	// never blocks on a busy worker: every polled batch is handed to its
	// worker before a rebalance may run.
	QueueDepth int

	// Registerer receives the consumer's metrics (default: not registered).
	// The library never registers with a global registry itself; to expose
	// the metrics with the rest of a program's, pass
	// prometheus.DefaultRegisterer (or your own registry).
	Registerer prometheus.Registerer

	// RetryInitialInterval is the first backoff after a handler error
	// (default 100ms).
	RetryInitialInterval time.Duration

	// RetryMaxAttempts is how many times a failing event is tried before it
	// is dead-lettered, the first try included (default 5).
	RetryMaxAttempts int

	// RetryMaxElapsed bounds the time spent retrying one event; when it is
	// exceeded the event is dead-lettered even if attempts remain
	// (default 30s).
	RetryMaxElapsed time.Duration

	// RetryMaxInterval caps the backoff between tries (default 5s).
	RetryMaxInterval time.Duration

	// SchemaRegistry reads the schemas of records in a registered wire
	// format (avro, protobuf, json-schema; pkg/wire) (default: none; such a
	// record is then dead-lettered as malformed, naming the missing
	// registry). json records and CloudEvents need none.
	SchemaRegistry *sr.Client

	// SealedFilterMaxBytes bounds the memory this process gives the
	// filters of the inbox's sealed buckets (default 128 MiB, the filters
	// of about 100M ids of the producers' own). Past it the smallest
	// filters are kept, and the other sealed buckets are probed as if not
	// sealed: every duplicate is still found, ids without a time cost one
	// index look-up more per such bucket (docs/consumer.md, "Sealed
	// buckets").
	SealedFilterMaxBytes int

	// SessionTimeout is how long the group waits for a member that stopped
	// heartbeating before it reassigns the member's partitions (default
	// 45s, franz-go's own). The broker bounds it
	// (group.min.session.timeout.ms, 6s by default).
	SessionTimeout time.Duration

	// TracerProvider makes the consumer's spans: per event a "process"
	// span continuing the event's trace, per Postgres transaction an "inbox
	// transaction" span, and the built-in handlers' spans (see
	// docs/tracing.md). Default: the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider

	// StartAt is where a partition starts when neither PostgreSQL nor the
	// consumer group has an offset for it — a new group, a new or recreated
	// topic (default StartEarliest: the whole retained log, so a new group
	// applies every event still on the topic, days of backlog included).
	// StartLatest or StartAt(t) skip what came before; with OrderSeq they
	// need FirstSeen = AcceptFirstSeen, since every stream's first event
	// then has a seq above 1.
	StartAt StartPosition

	// Topics to consume (required).
	Topics []string
}

// Hooks are functions the consumer calls at the points of its apply path
// where a crash matters, in the order below. A nil hook is skipped. They run
// on the partition's worker goroutine, so a hook that blocks stalls that
// partition; the library itself never needs them. The consumer binary
// installs the fault tests' failpoints through them.
type Hooks struct {
	// OnAfterHandler runs after the handlers' writes of a batch and before
	// its Postgres commit.
	OnAfterHandler func()

	// OnAfterPGCommit runs after a batch's Postgres commit and before its
	// offsets are marked for the Kafka commit.
	OnAfterPGCommit func()
}

func (h Hooks) afterHandler() {
	if h.OnAfterHandler != nil {
		h.OnAfterHandler()
	}
}

func (h Hooks) afterPGCommit() {
	if h.OnAfterPGCommit != nil {
		h.OnAfterPGCommit()
	}
}

// The defaults WithDefaults fills in (and DefaultConsumerName). Binaries
// register their flags with these, so a flag's default is the library's.
const (
	DefaultBatchMaxRecords        = 500
	DefaultBatchTimeout           = time.Minute
	DefaultCommitInterval         = time.Second
	DefaultCommitTimeout          = 10 * time.Second
	DefaultConcurrency            = 1
	DefaultFetchMaxBytes          = 1 << 20
	DefaultFetchMaxPartitionBytes = 256 << 10
	DefaultFetchMaxWait           = 50 * time.Millisecond
	DefaultGapCheckInterval       = time.Second
	DefaultGapTimeout             = seqguard.DefaultGapTimeout
	DefaultMaxParked              = seqguard.DefaultMaxParked
	DefaultMaxPayloadBytes        = envelope.DefaultMaxPayloadBytes
	DefaultQueueDepth             = 2
	DefaultRetryInitialInterval   = 100 * time.Millisecond
	DefaultRetryMaxAttempts       = 5
	DefaultRetryMaxElapsed        = 30 * time.Second
	DefaultRetryMaxInterval       = 5 * time.Second
	DefaultSealedFilterMaxBytes   = 128 << 20
	DefaultSessionTimeout         = 45 * time.Second
)

// MaxConcurrency bounds Concurrency.
const MaxConcurrency = 10000

// maxFetchBytes bounds FetchMaxBytes.
const maxFetchBytes = 1 << 30

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.BatchMaxRecords == 0 {
		c.BatchMaxRecords = DefaultBatchMaxRecords
	}
	if c.FetchMaxBytes == 0 {
		c.FetchMaxBytes = DefaultFetchMaxBytes
	}
	if c.FetchMaxPartitionBytes == 0 {
		c.FetchMaxPartitionBytes = DefaultFetchMaxPartitionBytes
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = DefaultFetchMaxWait
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = DefaultBatchTimeout
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = DefaultCommitTimeout
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.ConsumerName == "" {
		c.ConsumerName = DefaultConsumerName
	}
	if c.GapCheckInterval == 0 {
		c.GapCheckInterval = DefaultGapCheckInterval
	}
	if c.GapTimeout == 0 {
		c.GapTimeout = DefaultGapTimeout
	}
	if c.MaxParked == 0 {
		c.MaxParked = DefaultMaxParked
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = DefaultQueueDepth
	}
	if c.RetryInitialInterval == 0 {
		c.RetryInitialInterval = DefaultRetryInitialInterval
	}
	if c.RetryMaxAttempts == 0 {
		c.RetryMaxAttempts = DefaultRetryMaxAttempts
	}
	if c.RetryMaxElapsed == 0 {
		c.RetryMaxElapsed = DefaultRetryMaxElapsed
	}
	if c.RetryMaxInterval == 0 {
		c.RetryMaxInterval = DefaultRetryMaxInterval
	}
	if c.SealedFilterMaxBytes == 0 {
		c.SealedFilterMaxBytes = DefaultSealedFilterMaxBytes
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	return c
}

// newGuard returns the guard step Ordering asks for. The sequence guard
// reads its policy from c, which must outlive it (the consumer's own copy).
func newGuard(c *Config) guard {
	if c.Ordering == OrderArrival {
		return arrivalOrder{}
	}
	return newSeqGuard(c)
}

// validateGuard checks the sequence guard's settings (shared with
// ReplayConfig).
func (c *Config) validateGuard() error {
	bad := func(field, reason string) error { return &ConfigError{Field: field, Reason: reason} }
	switch {
	case c.FirstSeen != seqguard.ExpectFirstSeq1 && c.FirstSeen != seqguard.AcceptFirstSeen:
		return bad("FirstSeen", fmt.Sprintf("unknown value %d", int(c.FirstSeen)))
	case c.GapTimeout <= 0:
		return bad("GapTimeout", fmt.Sprintf("must be positive, got %s", c.GapTimeout))
	case c.MaxParked < 1:
		return bad("MaxParked", fmt.Sprintf("must be at least 1, got %d", c.MaxParked))
	}
	for _, r := range c.GapTimeouts {
		if err := r.validate(); err != nil {
			return bad("GapTimeouts", err.Error())
		}
	}
	return nil
}

// validate is New's check: the handler and the connections, then Validate.
func (c *Config) validate() error {
	bad := func(field, reason string) error { return &ConfigError{Field: field, Reason: reason} }
	switch {
	case c.Handler == nil && c.BatchHandler == nil:
		return bad("Handler", "is required (or BatchHandler)")
	case c.Handler != nil && c.BatchHandler != nil:
		return bad("BatchHandler", "must not be set together with Handler")
	case len(c.KafkaOpts) == 0:
		return bad("KafkaOpts", "is required (at least kgo.SeedBrokers)")
	case c.Pool == nil:
		return bad("Pool", "is required")
	}
	return c.Validate()
}

// Validate reports the first invalid setting of c as a *ConfigError naming
// the field. It checks c as it is: a zero setting that WithDefaults would
// fill is invalid here, so that a binary whose flags start at the Default*
// values can refuse an explicit zero (New fills the zero fields first and
// then checks the same rules). It leaves out Handler, BatchHandler,
// KafkaOpts and Pool, which New requires: a binary validates its settings
// before it builds those.
func (c *Config) Validate() error {
	bad := func(field, format string, a ...any) error {
		return &ConfigError{Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	positive := func(d time.Duration) bool { return d > 0 }
	switch {
	case c.Group == "":
		return bad("Group", "is required")
	case len(c.Topics) == 0:
		return bad("Topics", "is required")
	case c.ConsumerName == "":
		return bad("ConsumerName", "must not be empty")
	case c.BatchMaxRecords < 1:
		return bad("BatchMaxRecords", "must be at least 1, got %d", c.BatchMaxRecords)
	case !positive(c.BatchTimeout):
		return bad("BatchTimeout", "must be positive, got %s", c.BatchTimeout)
	case !positive(c.CommitInterval):
		return bad("CommitInterval", "must be positive, got %s", c.CommitInterval)
	case !positive(c.CommitTimeout):
		return bad("CommitTimeout", "must be positive, got %s", c.CommitTimeout)
	case c.Concurrency < 1 || c.Concurrency > MaxConcurrency:
		return bad("Concurrency", "must be between 1 and %d, got %d", MaxConcurrency, c.Concurrency)
	case c.FetchMaxWait < time.Millisecond:
		return bad("FetchMaxWait", "must be at least 1ms, got %s", c.FetchMaxWait)
	case c.FetchMaxBytes < 1 || c.FetchMaxBytes > maxFetchBytes:
		return bad("FetchMaxBytes", "must be between 1 and 1 GiB, got %d", c.FetchMaxBytes)
	case c.FetchMaxPartitionBytes < 1 || c.FetchMaxPartitionBytes > c.FetchMaxBytes:
		return bad("FetchMaxPartitionBytes", "must be between 1 and FetchMaxBytes (%d), got %d", c.FetchMaxBytes, c.FetchMaxPartitionBytes)
	case !positive(c.GapCheckInterval):
		return bad("GapCheckInterval", "must be positive, got %s", c.GapCheckInterval)
	case c.LatePolicy != seqguard.DeliverLate && c.LatePolicy != seqguard.Hold:
		return bad("LatePolicy", "unknown value %d", int(c.LatePolicy))
	case c.MaxPayloadBytes < 1:
		return bad("MaxPayloadBytes", "must be at least 1, got %d", c.MaxPayloadBytes)
	case c.SealedFilterMaxBytes < 1:
		return bad("SealedFilterMaxBytes", "must be at least 1 (a value below every filter's size loads none), got %d", c.SealedFilterMaxBytes)
	case c.Ordering != OrderSeq && c.Ordering != OrderArrival:
		return bad("Ordering", "unknown value %d", int(c.Ordering))
	case c.QueueDepth < 1:
		return bad("QueueDepth", "must be at least 1, got %d", c.QueueDepth)
	case c.RetryMaxAttempts < 1:
		return bad("RetryMaxAttempts", "must be at least 1, got %d", c.RetryMaxAttempts)
	case !positive(c.RetryInitialInterval):
		return bad("RetryInitialInterval", "must be positive, got %s", c.RetryInitialInterval)
	case !positive(c.RetryMaxInterval):
		return bad("RetryMaxInterval", "must be positive, got %s", c.RetryMaxInterval)
	case c.RetryMaxInterval < c.RetryInitialInterval:
		return bad("RetryMaxInterval", "(%s) must be at least RetryInitialInterval (%s)", c.RetryMaxInterval, c.RetryInitialInterval)
	case !positive(c.RetryMaxElapsed):
		return bad("RetryMaxElapsed", "must be positive, got %s", c.RetryMaxElapsed)
	case !positive(c.SessionTimeout):
		return bad("SessionTimeout", "must be positive, got %s", c.SessionTimeout)
	case !c.StartAt.IsEarliest() && c.Ordering == OrderSeq && c.FirstSeen == seqguard.ExpectFirstSeq1:
		return bad("StartAt", "%s skips the first seqs of every stream: with OrderSeq it needs FirstSeen %s, or every stream opens a gap at 1", c.StartAt, seqguard.AcceptFirstSeen)
	}
	for _, t := range c.Topics {
		if t == "" {
			return bad("Topics", "must not contain an empty name")
		}
	}
	return c.validateGuard()
}

// Validate reports the first invalid setting of c as a *ConfigError naming
// the field, checking c as it is, like Config.Validate: an explicit zero
// is refused. It leaves out Handler and Pool.
func (c ReplayConfig) Validate() error {
	if c.ConsumerName == "" {
		return &ConfigError{Field: "ConsumerName", Reason: "must not be empty"}
	}
	g := Config{FirstSeen: c.FirstSeen, GapTimeout: c.GapTimeout, GapTimeouts: c.GapTimeouts, MaxParked: c.MaxParked}
	return g.validateGuard()
}
