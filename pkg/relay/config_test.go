package relay

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
)

func validConfig() Config {
	return Config{DB: &pgxpool.Pool{}, KafkaOpts: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:9092")}}.WithDefaults()
}

func TestConfigValidateNamesTheField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		field  string
		mutate func(*Config)
	}{
		{"DB", func(c *Config) { c.DB = nil }},
		{"KafkaOpts", func(c *Config) { c.KafkaOpts = nil }},
		{"BatchMaxRows", func(c *Config) { c.BatchMaxRows = -1 }},
		{"BatchMaxBytes", func(c *Config) { c.BatchMaxBytes = -1 }},
		{"LeaseTTL", func(c *Config) { c.LeaseTTL = -time.Second }},
		{"LeaseRenewInterval", func(c *Config) { c.LeaseRenewInterval = 2 * time.Second }},
		{"PollInterval", func(c *Config) { c.PollInterval = -1 }},
		{"TransactionTimeout", func(c *Config) { c.TransactionTimeout = 10 * time.Millisecond }},
		{"PruneBatchRows", func(c *Config) { c.PruneBatchRows = -5 }},
		{"Shards", func(c *Config) { c.Shards = -1 }},
		{"Shard", func(c *Config) { c.Shards, c.Shard = 2, "default" }},
		{"Shard", func(c *Config) { c.Shards, c.Shard = 2, "2" }},
		{"Shard", func(c *Config) { c.Shards, c.Shard = 2, "-1" }},
		{"Shard", func(c *Config) { c.Shards, c.Shard = 4, "01" }},
		{"Shard", func(c *Config) { c.Shards, c.Shard = 4, "" }},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d", tt.field, i), func(t *testing.T) {
			t.Parallel()
			c := validConfig()
			tt.mutate(&c)
			err := c.validate()
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tt.field {
				t.Fatalf("validate() = %v, want a ConfigError for %s", err, tt.field)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("error %q does not name %s", err, tt.field)
			}
		})
	}
	if err := validConfig().validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := Config{}.WithDefaults()
	if c.LeaseTTL != 3*time.Second || c.LeaseRenewInterval != time.Second || c.StandbyInterval != 500*time.Millisecond ||
		c.Retention != time.Hour || c.BatchMaxRows != 1000 || c.Shard != "default" || c.HolderID == "" {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if c.Shards != 1 {
		t.Fatalf("default Shards = %d, want 1", c.Shards)
	}
	// With several shards, the shard index has no default.
	if c := (Config{Shards: 2}).WithDefaults(); c.Shard != "" {
		t.Fatalf("Shards 2: default Shard %q, want none", c.Shard)
	}
	for _, ok := range []Config{{Shards: 2, Shard: "0"}, {Shards: 2, Shard: "1"}, {Shards: 16, Shard: "15"}, {Shard: "blue"}} {
		c := validConfig()
		c.Shards, c.Shard = ok.Shards, ok.Shard
		if err := c.WithDefaults().validate(); err != nil {
			t.Errorf("Shard %q of %d: %v", ok.Shard, ok.Shards, err)
		}
	}
}

func TestMetricsLint(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := validConfig()
	c.Registerer = reg
	r, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	r.m.batchSize.Observe(3)
	r.m.txnDuration.Observe(0.01)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	n, err := testutil.GatherAndCount(reg)
	if err != nil {
		t.Fatal(err)
	}
	if n < 7 {
		t.Fatalf("%d metric series, want at least 7", n)
	}
}

// Validate checks a Config as it is: an explicit zero is refused (a binary
// whose flags start at the Default* values relies on it), while New fills
// the same zero with its default.
func TestValidateRefusesExplicitZero(t *testing.T) {
	t.Parallel()
	zero := map[string]func(*Config){
		"BackoffMax":         func(c *Config) { c.BackoffMax = 0 },
		"BatchMaxRows":       func(c *Config) { c.BatchMaxRows = 0 },
		"CheckpointTopic":    func(c *Config) { c.CheckpointTopic = "" },
		"LeaseTTL":           func(c *Config) { c.LeaseTTL = 0 },
		"RetrySetAsideAfter": func(c *Config) { c.RetrySetAsideAfter = 0 },
		"Shard":              func(c *Config) { c.Shard = "" },
		"StatsInterval":      func(c *Config) { c.StatsInterval = 0 },
	}
	for field, mutate := range zero {
		c := validConfig()
		mutate(&c)
		var ce *ConfigError
		if err := c.Validate(); !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("zero %s: Validate() = %v", field, err)
		}
		if err := c.WithDefaults().validate(); err != nil {
			t.Errorf("zero %s after WithDefaults: %v", field, err)
		}
	}
	if err := (Config{}).Validate(); err == nil {
		t.Error("Validate of a zero Config: nil")
	}
	if err := (Config{}).WithDefaults().Validate(); err != nil {
		t.Errorf("Validate leaves out DB and KafkaOpts, and the defaults are valid: %v", err)
	}
	d := Config{}.WithDefaults()
	if d.BackoffMax != DefaultBackoffMax || d.BatchMaxBytes != DefaultBatchMaxBytes || d.CheckpointTopic != DefaultCheckpointTopic ||
		d.PruneInterval != DefaultPruneInterval || d.TransactionTimeout != DefaultTransactionTimeout || d.StatsInterval != DefaultStatsInterval {
		t.Fatalf("WithDefaults does not use the Default* values: %+v", d)
	}
}

// The names a shard publishes and checkpoints under. -shards 1 keeps the
// names relays used before shards existed, so that an upgraded relay finds
// its checkpoint.
func TestShardNames(t *testing.T) {
	t.Parallel()
	const id = "5f0c2a4e-0000-4000-8000-000000009b10"
	tests := []struct {
		shard     string
		shards    int
		prefix    string
		txn, ckpt string
	}{
		{"", 0, "", "onceflow-relay-" + id + "-default", id + "/default"},
		{"blue", 1, "", "onceflow-relay-" + id + "-blue", id + "/blue"},
		{"1", 2, "", "onceflow-relay-" + id + "-1", id + "/1"},
		{"3", 4, "app-", "app-3", id + "/3"},
	}
	for _, tt := range tests {
		c := validConfig()
		c.Shard, c.Shards, c.TransactionalIDPrefix = tt.shard, tt.shards, tt.prefix
		r, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		if txn, ckpt := r.rec.txnIDOf(id, r.cfg.Shard), checkpointKey(id, r.cfg.Shard); txn != tt.txn || ckpt != tt.ckpt {
			t.Errorf("Shard %q of %d, prefix %q: transactional.id %q, checkpoint key %q; want %q, %q", tt.shard, tt.shards, tt.prefix, txn, ckpt, tt.txn, tt.ckpt)
		}
	}
}
