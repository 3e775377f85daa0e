package demo

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/onceflow/onceflow/internal/procs"
)

// start launches the named child (relay-a, consumer-b, …) unless it runs.
func (r *run) start(_ context.Context, name string) error {
	if r.procs.Running(name) {
		return nil
	}
	port, err := procs.FreePort()
	if err != nil {
		return err
	}
	brokers := strings.Join(r.brokers, ",")
	var args []string
	kind, _, _ := strings.Cut(name, "-")
	switch kind {
	case "relay":
		args = []string{"run", "-database-url", r.dbURL, "-kafka-brokers", brokers,
			"-http-addr", fmt.Sprintf("127.0.0.1:%d", port), "-holder-id", name,
			"-lease-ttl", "2s", "-lease-renew-interval", "500ms", "-standby-interval", "250ms",
			"-checkpoint-topic", r.checkpointTopic, "-transactional-id-prefix", r.txnIDPrefix}
	case "consumer":
		args = []string{"run", "-database-url", r.dbURL, "-kafka-brokers", brokers,
			"-http-addr", fmt.Sprintf("127.0.0.1:%d", port), "-group", r.group,
			"-topics", r.topic, "-consumer-name", consumerN,
			// Static membership: a restarted replica takes its place in the
			// group at once instead of waiting out the dead one's session.
			"-instance-id", name,
			"-handlers-file", filepath.Join(r.logDir, "handlers.json")}
		if r.cfg.GapTimeout > 0 {
			args = append(args, "-gap-timeout", r.cfg.GapTimeout.String())
		}
	}
	_, err = r.procs.Start(name, procs.Spec{Bin: filepath.Join(r.cfg.BinDir, kind), Args: args})
	return err
}

// kill SIGKILLs a child and waits for it to be gone.
func (r *run) kill(name string) { r.procs.Kill(name) }

// stopAll asks every child to drain (SIGTERM), then kills stragglers.
func (r *run) stopAll() { r.procs.StopAll(15 * time.Second) }
