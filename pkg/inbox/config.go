package inbox

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

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

	// ConsumerName is the logical consumer the inbox ledger belongs to
	// (default "default"). Deployments that must each apply every event use
	// different names; replicas or groups sharing a name dedup against each
	// other.
	ConsumerName string

	// DLQTopic, when set, receives a copy of every dead-lettered record with
	// the reason in the "onceflow-error" header (default: none). The inbox
	// row is the record of truth; the copy is best effort.
	DLQTopic string

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

	// Logger receives the consumer's logs (default: discarded).
	Logger *slog.Logger

	// MaxParked bounds the parked events of one source (default 1000). When
	// parking one more would exceed it, the source's lowest open gaps are
	// given up early (reason max_parked). Only with OrderSeq.
	MaxParked int

	// MaxPayloadBytes is the largest payload accepted; bigger records are
	// dead-lettered as malformed (default envelope.DefaultMaxPayloadBytes).
	MaxPayloadBytes int

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

	// SessionTimeout is how long the group waits for a member that stopped
	// heartbeating before it reassigns the member's partitions (default 0:
	// franz-go's 45s). The broker bounds it
	// (group.min.session.timeout.ms, 6s by default).
	SessionTimeout time.Duration

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

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.BatchMaxRecords == 0 {
		c.BatchMaxRecords = 500
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = time.Minute
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = time.Second
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = 10 * time.Second
	}
	if c.ConsumerName == "" {
		c.ConsumerName = DefaultConsumerName
	}
	if c.GapCheckInterval == 0 {
		c.GapCheckInterval = time.Second
	}
	if c.GapTimeout == 0 {
		c.GapTimeout = seqguard.DefaultGapTimeout
	}
	if c.MaxParked == 0 {
		c.MaxParked = seqguard.DefaultMaxParked
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = envelope.DefaultMaxPayloadBytes
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = 2
	}
	if c.RetryInitialInterval == 0 {
		c.RetryInitialInterval = 100 * time.Millisecond
	}
	if c.RetryMaxAttempts == 0 {
		c.RetryMaxAttempts = 5
	}
	if c.RetryMaxElapsed == 0 {
		c.RetryMaxElapsed = 30 * time.Second
	}
	if c.RetryMaxInterval == 0 {
		c.RetryMaxInterval = 5 * time.Second
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
	case c.GapTimeout < 0:
		return bad("GapTimeout", "must not be negative")
	case c.MaxParked < 1:
		return bad("MaxParked", "must be at least 1")
	}
	for _, r := range c.GapTimeouts {
		if err := r.validate(); err != nil {
			return bad("GapTimeouts", err.Error())
		}
	}
	return nil
}

func (c *Config) validate() error {
	bad := func(field, reason string) error { return &ConfigError{Field: field, Reason: reason} }
	switch {
	case c.Handler == nil && c.BatchHandler == nil:
		return bad("Handler", "is required (or BatchHandler)")
	case c.Handler != nil && c.BatchHandler != nil:
		return bad("BatchHandler", "must not be set together with Handler")
	case c.BatchMaxRecords < 1:
		return bad("BatchMaxRecords", "must be at least 1")
	case c.BatchTimeout < 0:
		return bad("BatchTimeout", "must not be negative")
	case c.CommitInterval < 0:
		return bad("CommitInterval", "must not be negative")
	case c.CommitTimeout < 0:
		return bad("CommitTimeout", "must not be negative")
	case c.GapCheckInterval < 0:
		return bad("GapCheckInterval", "must not be negative")
	case c.Group == "":
		return bad("Group", "is required")
	case len(c.KafkaOpts) == 0:
		return bad("KafkaOpts", "is required (at least kgo.SeedBrokers)")
	case c.LatePolicy != seqguard.DeliverLate && c.LatePolicy != seqguard.Hold:
		return bad("LatePolicy", fmt.Sprintf("unknown value %d", int(c.LatePolicy)))
	case c.MaxPayloadBytes < 0:
		return bad("MaxPayloadBytes", "must not be negative")
	case c.Ordering != OrderSeq && c.Ordering != OrderArrival:
		return bad("Ordering", fmt.Sprintf("unknown value %d", int(c.Ordering)))
	case c.Pool == nil:
		return bad("Pool", "is required")
	case c.QueueDepth < 1:
		return bad("QueueDepth", "must be at least 1")
	case c.RetryInitialInterval < 0:
		return bad("RetryInitialInterval", "must not be negative")
	case c.RetryMaxAttempts < 1:
		return bad("RetryMaxAttempts", "must be at least 1")
	case c.RetryMaxElapsed < 0:
		return bad("RetryMaxElapsed", "must not be negative")
	case c.RetryMaxInterval < c.RetryInitialInterval:
		return bad("RetryMaxInterval", "must be at least RetryInitialInterval")
	case c.SessionTimeout < 0:
		return bad("SessionTimeout", "must not be negative")
	case len(c.Topics) == 0:
		return bad("Topics", "is required")
	}
	if err := c.validateGuard(); err != nil {
		return err
	}
	for _, t := range c.Topics {
		if t == "" {
			return bad("Topics", "must not contain an empty name")
		}
	}
	return nil
}
