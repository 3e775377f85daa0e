package inbox

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/envelope"
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

	// Group is the Kafka consumer group (required).
	Group string

	// Handler applies one event. Exactly one of Handler and BatchHandler is
	// required.
	Handler Handler

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

	// Logger receives the consumer's logs (default: discarded).
	Logger *slog.Logger

	// MaxPayloadBytes is the largest payload accepted; bigger records are
	// dead-lettered as malformed (default envelope.DefaultMaxPayloadBytes).
	MaxPayloadBytes int

	// Pool is the Postgres pool holding onceflow.inbox (required).
	Pool *pgxpool.Pool

	// QueueDepth is how many fetched batches may wait for one partition's
	// worker before polling blocks (default 2).
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

	// Topics to consume (required).
	Topics []string

	// guard is the sequence-guard step (default: arrival order). See guard.go.
	guard guard
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.BatchMaxRecords == 0 {
		c.BatchMaxRecords = 500
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = time.Minute
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
	if c.guard == nil {
		c.guard = arrivalOrder{}
	}
	return c
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
	case c.Group == "":
		return bad("Group", "is required")
	case len(c.KafkaOpts) == 0:
		return bad("KafkaOpts", "is required (at least kgo.SeedBrokers)")
	case c.MaxPayloadBytes < 0:
		return bad("MaxPayloadBytes", "must not be negative")
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
	case len(c.Topics) == 0:
		return bad("Topics", "is required")
	}
	for _, t := range c.Topics {
		if t == "" {
			return bad("Topics", "must not contain an empty name")
		}
	}
	return nil
}
