package inbox

import (
	"context"
	"errors"
	"log/slog"
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
		{"FetchMaxBytes", func(c *Config) { c.FetchMaxBytes = -1 }},
		{"FetchMaxWait", func(c *Config) { c.FetchMaxWait = time.Microsecond }},
		{"FetchMaxPartitionBytes", func(c *Config) { c.FetchMaxPartitionBytes = -1 }},
		{"FetchMaxPartitionBytes", func(c *Config) { c.FetchMaxBytes, c.FetchMaxPartitionBytes = 1000, 2000 }},
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
		c.GapTimeout != 30*time.Second || c.GapCheckInterval != time.Second || c.MaxParked != 1000 || c.Ordering != OrderSeq ||
		c.FetchMaxBytes != 1<<20 || c.FetchMaxPartitionBytes != 256<<10 || c.FetchMaxWait != 50*time.Millisecond {
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

// Validate checks a Config as it is: an explicit zero is refused (a binary
// whose flags start at the Default* values relies on it), while New fills
// the same zero with its default. ReplayConfig.Validate alike.
func TestValidateRefusesExplicitZero(t *testing.T) {
	t.Parallel()
	h := HandlerFunc(func(context.Context, pgx.Tx, Event) error { return nil })
	good := Config{Group: "g", Topics: []string{"t"}, Handler: h, Pool: &pgxpool.Pool{}, KafkaOpts: []kgo.Opt{kgo.SeedBrokers("x:1")}}
	zero := map[string]func(*Config){
		"BatchMaxRecords":  func(c *Config) { c.BatchMaxRecords = 0 },
		"ConsumerName":     func(c *Config) { c.ConsumerName = "" },
		"FetchMaxWait":     func(c *Config) { c.FetchMaxWait = 0 },
		"GapTimeout":       func(c *Config) { c.GapTimeout = 0 },
		"MaxParked":        func(c *Config) { c.MaxParked = 0 },
		"MaxPayloadBytes":  func(c *Config) { c.MaxPayloadBytes = 0 },
		"RetryMaxElapsed":  func(c *Config) { c.RetryMaxElapsed = 0 },
		"SessionTimeout":   func(c *Config) { c.SessionTimeout = 0 },
		"GapCheckInterval": func(c *Config) { c.GapCheckInterval = 0 },
	}
	for field, mutate := range zero {
		c := good.WithDefaults()
		mutate(&c)
		var ce *ConfigError
		if err := c.Validate(); !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("zero %s: Validate() = %v", field, err)
		}
		c = c.WithDefaults()
		if err := c.validate(); err != nil {
			t.Errorf("zero %s after WithDefaults: %v", field, err)
		}
	}
	c := good.WithDefaults()
	c.FetchMaxBytes = 1<<30 + 1
	if err := c.Validate(); err == nil {
		t.Error("FetchMaxBytes over 1 GiB accepted")
	}
	rc := ReplayConfig{ConsumerName: DefaultConsumerName, GapTimeout: DefaultGapTimeout, MaxParked: DefaultMaxParked}
	if err := rc.Validate(); err != nil {
		t.Errorf("ReplayConfig with the defaults: %v", err)
	}
	rc.MaxParked = 0
	var ce *ConfigError
	if err := rc.Validate(); !errors.As(err, &ce) || ce.Field != "MaxParked" {
		t.Errorf("ReplayConfig MaxParked 0: %v", err)
	}
}

// TestDefaultLoggerIsSlogDefault: an embedded consumer without a Logger logs
// where the program logs, not nowhere.
func TestDefaultLoggerIsSlogDefault(t *testing.T) {
	if got := (Config{}).WithDefaults().Logger; got != slog.Default() {
		t.Fatalf("default Logger %p, want slog.Default() %p", got, slog.Default())
	}
	quiet := slog.New(slog.DiscardHandler)
	if got := (Config{Logger: quiet}).WithDefaults().Logger; got != quiet {
		t.Fatal("an explicit Logger was replaced")
	}
}
