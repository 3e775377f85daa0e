package inbox

import (
	"context"
	"errors"
	"testing"

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
	if c.ConsumerName != DefaultConsumerName || c.BatchMaxRecords != 500 || c.RetryMaxAttempts != 5 || c.guard == nil {
		t.Fatalf("defaults not applied: %+v", c)
	}
}
