package topics_test

import (
	"context"
	"flag"
	"log"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/topics"
)

// The relay's start-up check: register the flags next to the relay's own,
// then refuse to start when the checkpoint topic (or an event topic, checked
// the same way before its first publish) breaks the contract.
func ExampleConfig_CheckTopics() {
	var tc topics.Config
	fs := flag.NewFlagSet("relay run", flag.ContinueOnError)
	tc.RegisterFlags(fs) // -topics-spec, -topics-replication-factor
	if err := cli.Parse(fs, []string{"-topics-replication-factor", "1"}); err != nil {
		log.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:9092"))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()

	ctx := context.Background()
	if err := tc.CheckTopics(ctx, kadm.NewClient(cl), "onceflow.relay.checkpoints"); err != nil {
		log.Fatal(err) // a *topics.DriftError listing every drift, e.g. cleanup.policy
	}
}

// The `topics` subcommand of a binary: `relay topics verify|apply [flags]`.
func ExampleCommand() {
	ctx := context.Background()
	args := []string{"verify", "-kafka-brokers", "127.0.0.1:9092", "-topics-roles", "events,checkpoint"}
	if err := topics.Command(ctx, "relay", args, log.Writer(), nil); err != nil {
		log.Fatal(err) // errors.Is(err, topics.ErrDrift) on drift
	}
}
