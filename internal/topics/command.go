package topics

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/kafkaconn"
)

// Config selects the spec a binary enforces. Register its flags on the
// binary's FlagSet; the names carry a "topics-" prefix so they do not clash.
type Config struct {
	// ReplicationFactor, when positive, overrides every entry's replication
	// factor and caps min.insync.replicas at it, for development clusters
	// with fewer brokers (default 0: as in the spec).
	ReplicationFactor int
	// SpecPath is the spec file (default "": the spec built into the binary,
	// contract/topics.json).
	SpecPath string
}

// RegisterFlags registers -topics-spec and -topics-replication-factor.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.SpecPath, "topics-spec", "", "topic spec file (default: the contract/topics.json built into the binary)")
	fs.IntVar(&c.ReplicationFactor, "topics-replication-factor", 0, "override every topic's replication factor, capping min.insync.replicas at it (development clusters only; 0: as in the spec)")
}

// Load reads the spec (file or built-in) and applies the override.
func (c *Config) Load() (*Spec, error) {
	if c.ReplicationFactor < 0 || c.ReplicationFactor > math.MaxInt16 {
		return nil, fmt.Errorf("%s must be between 0 and %d, got %d",
			cli.Named("topics-replication-factor"), math.MaxInt16, c.ReplicationFactor)
	}
	var s *Spec
	var err error
	if c.SpecPath == "" {
		s, err = Default()
	} else {
		s, err = Load(c.SpecPath)
	}
	if err != nil {
		return nil, err
	}
	return s.WithReplicationFactor(int16(c.ReplicationFactor)), nil
}

// Check loads the spec, keeps the entries of roles (all when none are
// given) and verifies them: the start-up check. Drift gives a *DriftError.
func (c *Config) Check(ctx context.Context, adm *kadm.Client, roles ...Role) error {
	s, err := c.Load()
	if err != nil {
		return err
	}
	return Check(ctx, adm, s.Select(roles...))
}

// CheckTopics loads the spec and verifies the named topics against the
// entries that govern them (see VerifyTopics): the relay's start-up check of
// its checkpoint topic and of each event topic before it first publishes
// there. Drift gives a *DriftError.
func (c *Config) CheckTopics(ctx context.Context, adm *kadm.Client, names ...string) error {
	s, err := c.Load()
	if err != nil {
		return err
	}
	return CheckTopics(ctx, adm, s, names...)
}

// Command is the `topics` subcommand:
//
//	relay topics verify [-topics-spec FILE] [-topics-replication-factor N] [-topics-roles events,checkpoint] [-topics-timeout 1m] [-kafka-brokers …]
//	relay topics apply  [same flags] [-schema-registry-url URL]
//
// verify prints one line per drift and fails (returns a *DriftError) when
// there is any. Bad flags, a bad spec file and bad arguments are a
// *cli.UsageError (exit status 2); drift and an unreachable cluster are not
// (exit status 1). apply creates missing named topics and sets drifted configs,
// prints what it did, and fails when drift it does not fix remains
// (partition counts, replication factors).
func Command(ctx context.Context, prog string, args []string, stdout io.Writer, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return cli.Usagef("usage: %s topics verify|apply [flags]", prog)
	}
	sub, args := args[0], args[1:]
	if sub != "verify" && sub != "apply" {
		return cli.Usagef("%s topics: unknown subcommand %q (want verify or apply)", prog, sub)
	}
	fs := flag.NewFlagSet(prog+" topics "+sub, flag.ContinueOnError)
	var kc kafkaconn.Config
	kc.RegisterFlags(fs, "onceflow-"+prog) // the binary's one client id default
	var tc Config
	tc.RegisterFlags(fs)
	timeout := fs.Duration("topics-timeout", time.Minute, "give up on Kafka after this long")
	registryURL := fs.String("schema-registry-url", "", cli.SchemaRegistryHelp)
	var roles cli.List
	fs.Var(&roles, "topics-roles", "comma-separated roles to check: events, checkpoint, dlq (default: all)")
	if err := cli.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "usage: %s topics %s [flags]\n", prog, sub)
			cli.Usage(fs, stdout)
			return nil
		}
		return &cli.UsageError{Err: err}
	}
	if fs.NArg() > 0 {
		return cli.Usagef("%s topics %s: unexpected argument %q", prog, sub, fs.Arg(0))
	}
	if err := kc.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	if err := cli.PositiveDuration("topics-timeout", *timeout); err != nil {
		return &cli.UsageError{Err: err}
	}
	var rs []Role
	for _, r := range roles {
		switch Role(r) {
		case RoleEvents, RoleCheckpoint, RoleDLQ:
			rs = append(rs, Role(r))
		default:
			return cli.Usagef("%s: %q is not events, checkpoint or dlq", cli.Named("topics-roles"), r)
		}
	}
	spec, err := tc.Load()
	if err != nil {
		return &cli.UsageError{Err: err} // the spec is configuration
	}
	spec = spec.Select(rs...)
	var reg *sr.Client
	if spec.NeedsRegistry() {
		if *registryURL == "" {
			return cli.Usagef("%s is required: the spec has topics in avro, protobuf or json-schema", cli.Named("schema-registry-url"))
		}
		if reg, err = sr.NewClient(sr.URLs(*registryURL)); err != nil {
			return &cli.UsageError{Err: fmt.Errorf("%s: %w", cli.Named("schema-registry-url"), err)}
		}
	}
	cl, err := kgo.NewClient(kc.Opts(log)...)
	if err != nil {
		return fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	if sub == "verify" {
		drifts, err := Verify(ctx, adm, spec)
		if err != nil {
			return err
		}
		if reg != nil {
			sds, err := VerifySchemas(ctx, reg, spec)
			if err != nil {
				return err
			}
			drifts = append(drifts, sds...)
		}
		for _, d := range drifts {
			fmt.Fprintf(stdout, "drift: %s\n", d)
		}
		if len(drifts) > 0 {
			log.ErrorContext(ctx, "topics drift from the contract", slog.Int("drifts", len(drifts)))
			return &DriftError{Drifts: drifts}
		}
		fmt.Fprintf(stdout, "topics match the contract (%d spec entries)\n", len(spec.Topics))
		return nil
	}
	if reg != nil {
		// Schemas first: an incompatible change stops apply before a topic
		// is created or altered, so nothing is written under it.
		done, err := ApplySchemas(ctx, reg, spec)
		for _, line := range done {
			fmt.Fprintf(stdout, "registered: %s\n", line)
		}
		if err != nil {
			log.ErrorContext(ctx, "schema refused", slog.String("error", err.Error()))
			return err
		}
	}
	res, err := Apply(ctx, adm, spec)
	for _, t := range res.Created {
		fmt.Fprintf(stdout, "created: topic %q\n", t)
		log.InfoContext(ctx, "created topic", slog.String("topic", t))
	}
	for _, d := range res.Altered {
		fmt.Fprintf(stdout, "altered: topic %q: %s %q -> %q\n", d.Topic, d.Field, d.Got, d.Want)
		log.InfoContext(ctx, "altered topic config", slog.String("topic", d.Topic), slog.String("config", d.Field),
			slog.String("from", d.Got), slog.String("to", d.Want))
	}
	for _, d := range res.Remaining {
		fmt.Fprintf(stdout, "drift: %s\n", d)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "topics match the contract (%d spec entries)\n", len(spec.Topics))
	return nil
}
