package relay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/wire"
)

// Config configures a Relay. Fields are alphabetized; each says its default.
// Call WithDefaults to fill the zero fields.
type Config struct {
	// BackoffMax caps the exponential backoff (with jitter) between retries
	// of Kafka and PostgreSQL errors. Default 5s.
	BackoffMax time.Duration
	// BatchMaxBytes bounds the payload bytes of one Kafka transaction (a
	// single larger row is still published alone). Default 4 MiB.
	BatchMaxBytes int
	// BatchMaxRows bounds the rows of one Kafka transaction. Default 1000.
	BatchMaxRows int
	// Clock is the wall clock the relay stamps its records with (the Kafka
	// record timestamp, CreateTime, and the CloudEvents time attribute).
	// Nothing the relay decides reads it: the lease, retry times and
	// retention are on the database's clock. Default time.Now (the soak
	// skews it through ONCEFLOW_CLOCK_SKEW, internal/wallclock).
	Clock func() time.Time
	// CheckpointTopic is the compacted topic that receives one checkpoint
	// record per transaction (key = "<database identity>/<shard>", value =
	// the identity and the batch's outbox ids with a fingerprint of each
	// row's event id). Relays of many databases may share it. It is created
	// (1 partition, cleanup.policy=compact) when missing.
	// Default "onceflow.relay.checkpoints".
	CheckpointTopic string
	// DB is the pool the relay reads and marks the outbox with (required).
	DB *pgxpool.Pool
	// DeleteOnPublish deletes rows when their Kafka transaction has
	// committed instead of taking them off the queue onceflow.outbox_pending
	// into the publish log onceflow.outbox_published and pruning them after
	// Retention. Neither mode rewrites an outbox row; deleting saves the
	// log row and the later prune (about a third more drain throughput in
	// make bench), at the price of no record of published rows.
	// Default false.
	DeleteOnPublish bool
	// HolderID identifies this process in onceflow.relay_lease. A process
	// restarted under the same HolderID (e.g. a pod name) takes its own lease
	// back at once; two live processes must never share one. Default
	// hostname-pid-random.
	HolderID string
	// Hooks are called at the points of the publish path where a crash
	// matters (default: none). Fault tests install them to kill or freeze
	// the process there; see Hooks.
	Hooks Hooks
	// KafkaOpts are the client options for brokers, TLS, SASL and logging
	// (required: at least kgo.SeedBrokers). The relay adds the transactional
	// settings itself.
	KafkaOpts []kgo.Opt
	// LeaseRenewInterval is how often a leader renews its lease. Default 1s;
	// must be under LeaseTTL/2.
	LeaseRenewInterval time.Duration
	// LeaseTTL is how long a lease lives without renewal; a standby takes
	// over this long after the leader's last renewal. Default 3s.
	LeaseTTL time.Duration
	// Listen makes the leader LISTEN on channel "onceflow_outbox" and poll
	// at once when notified. Producers notify only once the trigger
	// onceflow.outbox_notify is enabled (it is created disabled, because
	// NOTIFY serializes committing producers). Polling continues either
	// way. Default false.
	Listen bool
	// Logger receives the relay's logs. Default: discarded.
	Logger *slog.Logger
	// PollInterval is the wait between polls when the outbox had nothing to
	// publish (a full batch polls again at once). Default 20ms.
	PollInterval time.Duration
	// PruneBatchRows is about how many published rows one prune statement
	// deletes: whole publish batches, at least one. Default 1000.
	PruneBatchRows int
	// PruneInterval is how often the leader prunes published rows. Default 1s.
	PruneInterval time.Duration
	// Registerer receives the relay's metrics. Default: none registered.
	Registerer prometheus.Registerer
	// RetrySetAsideAfter is how long a row set aside for a cause that may go
	// away by itself (a missing topic, a missing ACL, a topic breaking its
	// contract) waits before the relay tries it again; the wait doubles with
	// every refusal, up to 10 minutes. Rows refused for their content (too
	// large, an illegal topic name) wait for an operator instead. Default
	// 30s.
	RetrySetAsideAfter time.Duration
	// Retention keeps published rows this long before pruning them (unless
	// DeleteOnPublish); 0 uses the default, a negative value prunes them at
	// the next prune. Default 1h.
	Retention time.Duration
	// Shard names this relay's shard: its lease row, transactional.id
	// suffix and checkpoint key suffix. With Shards 1 (the default) the
	// shard publishes every source, and all relays of one database must use
	// the same Shard (default "default"). With Shards N > 1 it is this
	// relay's shard index K in decimal, 0 <= K < N (no default): the relay
	// publishes only the sources whose SourceShard is K, and the relays of
	// each K elect their own leader.
	Shard string
	// Shards is how many shards split the database's sources (see Shard
	// and SourceShard); every relay of one database must use the same
	// count. A relay takes no lease while a relay with another count holds
	// one (docs/relay.md, "Shards"). Default 1.
	Shards int
	// StandbyInterval is how often a standby tries to take the lease.
	// Default 500ms.
	StandbyInterval time.Duration
	// StatsInterval is how often the leader refreshes the pending-rows and
	// oldest-age gauges. Default 2s.
	StatsInterval time.Duration
	// TopicCheck, when set, is called once per topic before the relay first
	// publishes to it (e.g. to verify the topic against contract/topics.json).
	// An error wrapping ErrTopicRefused sets the row aside (reason
	// topic_contract, tried again after RetrySetAsideAfter): only its source
	// waits. Any other error (the broker unreachable) holds the batch and is
	// retried with backoff. Both count as errors_total{kind="topic"}.
	// Default: none.
	TopicCheck func(ctx context.Context, topic string) error
	// Wire encodes each event for its topic's wire format (json, avro,
	// protobuf, json-schema; CloudEvents) and sets the contract-version
	// header (docs/contract.md). A payload that does not fit the topic's
	// schema sets its row aside (reason schema_mismatch); only its source
	// waits. Default nil: every topic json.
	Wire *wire.Encoder
	// TracerProvider makes the span of each Kafka transaction ("relay
	// transaction", linked to each event's producer context; see
	// docs/tracing.md). Default: the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
	// TransactionTimeout is the Kafka transaction.timeout.ms. Default 10s.
	TransactionTimeout time.Duration
	// TransactionalIDPrefix + Shard is the producer's transactional.id,
	// stable across restarts so that a new leader fences the old one. It
	// must be unique to this database among every relay on the Kafka
	// cluster: two databases' relays sharing one fence each other.
	// Default "onceflow-relay-<database identity>-", unique by construction.
	TransactionalIDPrefix string
}

// Hooks are functions the relay calls at the points of its publish path
// where a crash matters. A nil hook is skipped. They run on the leader's
// publish goroutine, so a hook that blocks stalls publishing (and the lease
// runs out meanwhile); the library itself never needs them. The relay binary
// installs the fault tests' failpoints through them.
type Hooks struct {
	// CheckpointReaderOpts returns client options appended to KafkaOpts for
	// the client that reads the last checkpoint back during recovery (each
	// time one is made). The fault tests slow the checkpoint partition's
	// answers with a dialer here.
	CheckpointReaderOpts func() []kgo.Opt

	// OnAfterKafkaCommit runs after a batch's Kafka transaction committed
	// and before the batch is marked published in PostgreSQL: the rows are
	// on Kafka, only the checkpoint says so.
	OnAfterKafkaCommit func()

	// OnBeforeKafkaCommit runs after a batch's records and its checkpoint
	// were produced and the lease was checked for the last time, right
	// before the Kafka commit (EndTransaction). A hook that blocks here
	// makes a zombie: a leader that believes it still leads, which the
	// Kafka fence of its transactional.id must stop.
	OnBeforeKafkaCommit func()
}

func (h Hooks) beforeKafkaCommit() {
	if h.OnBeforeKafkaCommit != nil {
		h.OnBeforeKafkaCommit()
	}
}

func (h Hooks) afterKafkaCommit() {
	if h.OnAfterKafkaCommit != nil {
		h.OnAfterKafkaCommit()
	}
}

// checkpointReaderOpts are the options of a checkpoint reader's client.
func (h Hooks) checkpointReaderOpts(opts []kgo.Opt) []kgo.Opt {
	if h.CheckpointReaderOpts == nil {
		return opts
	}
	return append(slices.Clone(opts), h.CheckpointReaderOpts()...)
}

// The defaults WithDefaults fills in. Binaries register their flags with
// these, so a flag's default is the library's.
const (
	DefaultBackoffMax         = 5 * time.Second
	DefaultBatchMaxBytes      = 4 << 20
	DefaultBatchMaxRows       = 1000
	DefaultCheckpointTopic    = "onceflow.relay.checkpoints"
	DefaultLeaseRenewInterval = time.Second
	DefaultLeaseTTL           = 3 * time.Second
	DefaultPollInterval       = 20 * time.Millisecond
	DefaultPruneBatchRows     = 1000
	DefaultPruneInterval      = time.Second
	DefaultRetention          = time.Hour
	DefaultRetrySetAsideAfter = 30 * time.Second
	DefaultShard              = "default"
	DefaultShards             = 1
	DefaultStandbyInterval    = 500 * time.Millisecond
	DefaultStatsInterval      = 2 * time.Second
	DefaultTransactionTimeout = 10 * time.Second
)

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.BackoffMax == 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	if c.BatchMaxBytes == 0 {
		c.BatchMaxBytes = DefaultBatchMaxBytes
	}
	if c.BatchMaxRows == 0 {
		c.BatchMaxRows = DefaultBatchMaxRows
	}
	if c.CheckpointTopic == "" {
		c.CheckpointTopic = DefaultCheckpointTopic
	}
	if c.HolderID == "" {
		host, _ := os.Hostname()
		c.HolderID = host + "-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	}
	if c.LeaseRenewInterval == 0 {
		c.LeaseRenewInterval = DefaultLeaseRenewInterval
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.PruneBatchRows == 0 {
		c.PruneBatchRows = DefaultPruneBatchRows
	}
	if c.PruneInterval == 0 {
		c.PruneInterval = DefaultPruneInterval
	}
	if c.RetrySetAsideAfter == 0 {
		c.RetrySetAsideAfter = DefaultRetrySetAsideAfter
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.Shard == "" && c.Shards == 1 {
		c.Shard = DefaultShard
	}
	if c.StandbyInterval == 0 {
		c.StandbyInterval = DefaultStandbyInterval
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = DefaultStatsInterval
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	return c
}

// now reads c.Clock, else the host's clock.
func (c Config) now() time.Time {
	if c.Clock != nil {
		return c.Clock()
	}
	return time.Now()
}

// clockBehind is how far c.Clock is behind the host's clock (0 when it is
// not). The Kafka client measures a record's delivery timeout from the
// record's timestamp with the host's clock: on a host whose clock is off
// both agree, but a Clock skewed in-process (a fault test) stamps records
// that would look that much older to it, and the delivery timeout grows by
// as much. A Clock ahead makes them look younger; the transaction's own
// deadline (TransactionTimeout) still bounds the batch.
func (c Config) clockBehind() time.Duration {
	if c.Clock == nil {
		return 0
	}
	// Round(0) drops the monotonic readings: the wall clocks are compared.
	return max(0, time.Now().Round(0).Sub(c.Clock().Round(0)))
}

// validate is New's check: the required connections, then Validate.
func (c Config) validate() error {
	switch {
	case c.DB == nil:
		return &ConfigError{Field: "DB", Reason: "is required"}
	case len(c.KafkaOpts) == 0:
		return &ConfigError{Field: "KafkaOpts", Reason: "is required (at least kgo.SeedBrokers)"}
	}
	return c.Validate()
}

// Validate reports the first invalid setting of c as a *ConfigError naming
// the field. It checks c as it is: a zero setting that WithDefaults would
// fill is invalid here, so that a binary whose flags start at the Default*
// values can refuse an explicit zero (New fills the zero fields first and
// then checks the same rules). It leaves out DB and KafkaOpts, which New
// requires: a binary validates its settings before it builds those.
func (c Config) Validate() error {
	bad := func(field, format string, a ...any) error {
		return &ConfigError{Field: field, Reason: fmt.Sprintf(format, a...)}
	}
	positive := map[string]time.Duration{
		"BackoffMax": c.BackoffMax, "LeaseRenewInterval": c.LeaseRenewInterval, "LeaseTTL": c.LeaseTTL,
		"PollInterval": c.PollInterval, "PruneInterval": c.PruneInterval, "StandbyInterval": c.StandbyInterval,
		"StatsInterval": c.StatsInterval, "TransactionTimeout": c.TransactionTimeout, "RetrySetAsideAfter": c.RetrySetAsideAfter,
	}
	for _, f := range []string{"BackoffMax", "LeaseRenewInterval", "LeaseTTL", "PollInterval", "PruneInterval", "RetrySetAsideAfter", "StandbyInterval", "StatsInterval", "TransactionTimeout"} {
		if positive[f] <= 0 {
			return bad(f, "must be positive, got %s", positive[f])
		}
	}
	switch {
	case c.BatchMaxRows < 1:
		return bad("BatchMaxRows", "must be at least 1, got %d", c.BatchMaxRows)
	case c.BatchMaxBytes < 1:
		return bad("BatchMaxBytes", "must be at least 1, got %d", c.BatchMaxBytes)
	case c.PruneBatchRows < 1:
		return bad("PruneBatchRows", "must be at least 1, got %d", c.PruneBatchRows)
	case c.LeaseRenewInterval*2 > c.LeaseTTL:
		return bad("LeaseRenewInterval", "(%s) must be at most half of LeaseTTL (%s)", c.LeaseRenewInterval, c.LeaseTTL)
	case c.TransactionTimeout < time.Second:
		return bad("TransactionTimeout", "must be at least 1s, got %s", c.TransactionTimeout)
	case c.CheckpointTopic == "":
		return bad("CheckpointTopic", "is required")
	case c.Shards < 1:
		return bad("Shards", "must be at least 1, got %d", c.Shards)
	case c.Shards > 1 && !isShardIndex(c.Shard, c.Shards):
		return bad("Shard", "must be this relay's shard index 0 <= K < Shards (%d) in decimal when Shards > 1, got %q", c.Shards, c.Shard)
	case c.Shard == "":
		return bad("Shard", "is required")
	case len(c.TransactionalIDPrefix+c.Shard) > 200, c.TransactionalIDPrefix == "" && len(DefaultTransactionalID(zeroUUID, c.Shard)) > 200:
		return bad("Shard", "with TransactionalIDPrefix is over 200 bytes")
	}
	return nil
}

// zeroUUID has the length of a database identity.
const zeroUUID = "00000000-0000-0000-0000-000000000000"
