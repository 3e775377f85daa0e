// Command soak runs onceflow's chaos soak: see internal/soak. `make soak
// DURATION=1h` builds the binaries and runs it.
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

	"github.com/onceflow/onceflow/internal/soak"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		if errors.Is(err, errAnomalies) {
			os.Exit(1)
		}
		os.Exit(2)
	}
}

var errAnomalies = errors.New("anomalies found")

func run() error {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	var cfg soak.Config
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "how long producers write and faults are injected")
	fs.IntVar(&cfg.Rate, "rate", 320, "offered load in events per second, probes included (320: above 1M events an hour after the outages)")
	fs.DurationVar(&cfg.FaultInterval, "fault-interval", 4*time.Second, "mean pause between one fault's recovery and the next fault")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the fault schedule and the producers' choices (0: time-based)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", 10*time.Minute, "longest wait for every committed event to be applied after producing stops")
	fs.DurationVar(&cfg.RecoveryTimeout, "recovery-timeout", 2*time.Minute, "longest wait for progress after one fault before it counts as a stall")
	fs.IntVar(&cfg.Writers, "writers", 6, "producer goroutines (alternating between the two producing databases)")
	fs.DurationVar(&cfg.SnapshotHold, "snapshot-hold", 3*time.Minute, "how long each producing database's REPEATABLE READ snapshot is held before the next replaces it")
	fs.Float64Var(&cfg.OutageScale, "outage-scale", 1, "multiplies every fault's outage (short runs: below 1)")
	kinds := fs.String("faults", "", "comma-separated fault kinds (default all: "+strings.Join(soak.AllKinds, ",")+")")
	binDir := fs.String("bin-dir", "bin", "directory holding the relay and consumer binaries")
	out := fs.String("out", "soak-results", "directory for the run's report.txt, report.json, lag.png and logs (a subdirectory per run)")
	script := fs.String("services-script", "scripts/services.sh", "scripts/services.sh, asked for the Kafka jars")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if cfg.Duration <= 0 || cfg.Rate <= 0 {
		return fmt.Errorf("-duration and -rate must be positive")
	}
	if *kinds != "" {
		cfg.Kinds = strings.Split(*kinds, ",")
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano()) & (1<<53 - 1) // exact in JSON
	}
	var err error
	if cfg.BinDir, err = filepath.Abs(*binDir); err != nil {
		return err
	}
	cfg.ServicesScript = *script
	cfg.OutDir = filepath.Join(*out, fmt.Sprintf("%s-seed%d", time.Now().Format("20060102-150405"), cfg.Seed))
	cfg.Out = os.Stdout
	cfg.Command = fmt.Sprintf("make soak DURATION=%s SEED=%d SOAK_ARGS='-rate %d -fault-interval %s -outage-scale %g -snapshot-hold %s'",
		cfg.Duration, cfg.Seed, cfg.Rate, cfg.FaultInterval, cfg.OutageScale, cfg.SnapshotHold)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := soak.Run(ctx, cfg)
	if err != nil {
		return err
	}
	latest := filepath.Join(*out, "latest")
	_ = os.Remove(latest)
	_ = os.Symlink(filepath.Base(cfg.OutDir), latest)
	fmt.Print("\n" + rep.Text())
	fmt.Printf("report: %s (report.txt, report.json, lag.png, logs/)\n", cfg.OutDir)
	fmt.Printf("replay: %s\n", cfg.Command)
	if !rep.OK {
		return fmt.Errorf("%w: %d kinds, see %s", errAnomalies, len(rep.Anomalies), filepath.Join(cfg.OutDir, "report.txt"))
	}
	return nil
}
