package inbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestConfigValidateNamesTheField(t *testing.T) {
	t.Parallel()
	h := HandlerFunc(func(context.Context, pgx.Tx, Event) error { return nil })
	good := Config{Group: "g", Topics: []string{"t"}, Handler: h, Pool: &pgxpool.Pool{}, KafkaOpts: []kgo.Opt{kgo.SeedBrokers("x:1")}}
	cases := []struct {
		field string
		mut   func(*Config)
	}{
		{"Handler", func(c *Config) { c.Handler = nil }},
		{"BatchHandler", func(c *Config) { c.BatchHandler = asBatch(h) }},
		{"Group", func(c *Config) { c.Group = "" }},
		{"Topics", func(c *Config) { c.Topics = nil }},
		{"Topics", func(c *Config) { c.Topics = []string{""} }},
		{"Pool", func(c *Config) { c.Pool = nil }},
		{"KafkaOpts", func(c *Config) { c.KafkaOpts = nil }},
		{"BatchMaxRecords", func(c *Config) { c.BatchMaxRecords = -1 }},
		{"RetryMaxAttempts", func(c *Config) { c.RetryMaxAttempts = -2 }},
		{"RetryMaxInterval", func(c *Config) { c.RetryInitialInterval, c.RetryMaxInterval = 10, 5 }},
		{"QueueDepth", func(c *Config) { c.QueueDepth = -1 }},
		{"Ordering", func(c *Config) { c.Ordering = 7 }},
		{"FirstSeen", func(c *Config) { c.FirstSeen = 7 }},
		{"LatePolicy", func(c *Config) { c.LatePolicy = 7 }},
		{"MaxParked", func(c *Config) { c.MaxParked = -1 }},
		{"GapTimeout", func(c *Config) { c.GapTimeout = -1 }},
		{"GapCheckInterval", func(c *Config) { c.GapCheckInterval = -1 }},
		{"GapTimeouts", func(c *Config) { c.GapTimeouts = []GapTimeout{{Pattern: "[", Timeout: 1}} }},
		{"GapTimeouts", func(c *Config) { c.GapTimeouts = []GapTimeout{{Pattern: "a.*", Timeout: 0}} }},
	}
	for _, tc := range cases {
		t.Run(tc.field, func(t *testing.T) {
			t.Parallel()
			c := good
			tc.mut(&c)
			c = c.WithDefaults()
			err := c.validate()
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("validate() = %v, want a ConfigError naming %s", err, tc.field)
			}
		})
	}
	c := good.WithDefaults()
	if err := c.validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	if c.ConsumerName != DefaultConsumerName || c.BatchMaxRecords != 500 || c.RetryMaxAttempts != 5 ||
		c.GapTimeout != 30*time.Second || c.GapCheckInterval != time.Second || c.MaxParked != 1000 || c.Ordering != OrderSeq {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if g := newGuard(&c); !isSeqGuard(g) {
		t.Fatalf("default guard %T, want the sequence guard", g)
	}
}

func TestParseGapTimeouts(t *testing.T) {
	t.Parallel()
	got, err := ParseGapTimeouts(" billing.*=5m, agent.*=10s ,")
	if err != nil || len(got) != 2 || got[0] != (GapTimeout{"billing.*", 5 * time.Minute}) || got[1] != (GapTimeout{"agent.*", 10 * time.Second}) {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"billing.*", "x=5", "[=1s", "=1s", "a=-1s"} {
		if _, err := ParseGapTimeouts(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	g := newSeqGuard(&Config{GapTimeout: time.Second, GapTimeouts: got})
	for typ, want := range map[string]time.Duration{"billing.paid": 5 * time.Minute, "agent.step": 10 * time.Second, "other": time.Second} {
		if p := g.policy(typ); p.GapTimeout != want {
			t.Errorf("%s: timeout %v, want %v", typ, p.GapTimeout, want)
		}
	}
}

func isSeqGuard(g guard) bool {
	_, ok := g.(*seqGuard)
	return ok
}
