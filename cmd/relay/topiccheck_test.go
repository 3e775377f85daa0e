package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/logbuf"
	"github.com/onceflow/onceflow/internal/topics"
)

// The start-time check of the checkpoint topic retries a failure to ask
// (a freshly created topic not yet known to every broker) and gives up at
// once on drift.
func TestCheckCheckpointTopicRetriesOnlyFailuresToAsk(t *testing.T) {
	t.Parallel()
	logs := &logbuf.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	ctx := context.Background()

	calls := 0
	err := checkCheckpointTopic(ctx, log, 10*time.Millisecond, func() error {
		calls++
		if calls < 3 {
			return errors.New("describe topic configs: UNKNOWN_TOPIC_OR_PARTITION")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("transient failures: err %v after %d calls, want nil after 3", err, calls)
	}
	if n := strings.Count(logs.String(), "checking the checkpoint topic failed; retrying"); n != 2 {
		t.Errorf("%d retry warnings, want 2:\n%s", n, logs)
	}

	calls = 0
	drift := &topics.DriftError{Drifts: []topics.Drift{{Topic: "ckpt", Kind: topics.KindMissing, Field: "topic", Want: "present"}}}
	err = checkCheckpointTopic(ctx, log, 10*time.Millisecond, func() error { calls++; return drift })
	if !errors.Is(err, topics.ErrDrift) || calls != 1 {
		t.Fatalf("drift: err %v after %d calls, want the drift after 1", err, calls)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := checkCheckpointTopic(cctx, log, 10*time.Millisecond, func() error { return errors.New("no broker") }); err == nil {
		t.Fatal("a cancelled start returned nil")
	}
}
