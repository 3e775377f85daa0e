// Package kafkaconn turns the binaries' Kafka settings into franz-go client
// options. Connection security (TLS, SASL) is added here so both binaries get
// it the same way.
package kafkaconn

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/onceflow/onceflow/internal/cli"
)

// Config holds the connection settings shared by both binaries.
type Config struct {
	// Brokers is the seed broker list (required).
	Brokers cli.List
	// ClientID names the client in broker logs (default "onceflow").
	ClientID string
}

// RegisterFlags registers -kafka-brokers and -kafka-client-id.
func (c *Config) RegisterFlags(fs *flag.FlagSet, defaultClientID string) {
	fs.Var(&c.Brokers, "kafka-brokers", "comma-separated Kafka seed brokers, host:port (required)")
	fs.StringVar(&c.ClientID, "kafka-client-id", defaultClientID, "Kafka client id")
}

// Validate names the bad setting.
func (c *Config) Validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("-kafka-brokers (ONCEFLOW_KAFKA_BROKERS) is required")
	}
	for _, b := range c.Brokers {
		if !strings.Contains(b, ":") {
			return fmt.Errorf("-kafka-brokers (ONCEFLOW_KAFKA_BROKERS): %q is not host:port", b)
		}
	}
	return nil
}

// Opts returns the client options for these settings, logging through log.
func (c *Config) Opts(log *slog.Logger) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...)}
	if c.ClientID != "" {
		opts = append(opts, kgo.ClientID(c.ClientID))
	}
	if log != nil {
		opts = append(opts, kgo.WithLogger(kslog.New(log.With(slog.String("component", "kafka")))))
	}
	return opts
}
