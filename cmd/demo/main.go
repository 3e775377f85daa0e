// Command demo runs onceflow end to end on embedded defaults: see
// internal/demo. `make demo` builds the binaries and runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/onceflow/onceflow/cmd/demo/internal/demo"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		if errors.Is(err, errInvariant) {
			os.Exit(1)
		}
		os.Exit(2)
	}
}

var errInvariant = errors.New("an invariant broke")

func run() error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	duration := fs.Duration("duration", 30*time.Second, "how long the producer writes events")
	rate := fs.Int("rate", 200, "events per second the producer writes")
	kafka := fs.String("kafka", "embedded", "embedded (franz-go kfake, in process) or local (the project's Apache Kafka via scripts/services.sh)")
	chaos := fs.Bool("chaos", true, "inject duplicates, kills, reordering and a never-filled gap")
	gapTimeout := fs.Duration("gap-timeout", 5*time.Second, "the consumer's sequence gap timeout")
	binDir := fs.String("bin-dir", "bin", "directory holding the relay and consumer binaries")
	seed := fs.Uint64("seed", 0, "random seed (0: time-based)")
	logDir := fs.String("log-dir", "", "keep the children's logs here (default: a temp dir kept only on failure)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if *duration <= 0 || *rate <= 0 {
		return fmt.Errorf("-duration and -rate must be positive")
	}
	cfg := demo.Config{BinDir: *binDir, Chaos: *chaos, Duration: *duration, GapTimeout: *gapTimeout,
		LogDir: *logDir, Out: os.Stdout, Rate: *rate, Seed: *seed, DatabaseURL: os.Getenv("DEMO_DATABASE_URL")}
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		cfg.Brokers = strings.Split(b, ",")
	} else if *kafka == "local" {
		b := os.Getenv("ONCEFLOW_TEST_KAFKA_BROKERS")
		if b == "" {
			return fmt.Errorf("-kafka=local: start it with `make services-up` and export ONCEFLOW_TEST_KAFKA_BROKERS, or run `make demo KAFKA=local`")
		}
		cfg.Brokers = strings.Split(b, ",")
	} else if *kafka != "embedded" {
		return fmt.Errorf("-kafka %q: want embedded or local", *kafka)
	}
	if abs, err := filepath.Abs(cfg.BinDir); err == nil {
		cfg.BinDir = abs
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sum, err := demo.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if !sum.OK() {
		return fmt.Errorf("%w: %s", errInvariant, strings.Join(sum.Violations, "; "))
	}
	return nil
}
