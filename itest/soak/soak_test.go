package soak

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/soak"
	"github.com/onceflow/onceflow/internal/testkit"
)

// logWriter sends each line to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestSoak runs the soak for two minutes (ONCEFLOW_SOAK_DURATION to
// change it) and requires zero anomalies, from its ledger and from the
// reconcile check, with at least one broker kill, one database restart, one
// proxy cut and one process kill among its faults.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts three brokers and a database")
	}
	duration := 2 * time.Minute
	if v := os.Getenv("ONCEFLOW_SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("ONCEFLOW_SOAK_DURATION: %v", err)
		}
		duration = d
	}
	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.MkdirTemp("", "onceflow-soak-test-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), duration+10*time.Minute)
	defer cancel()
	rep, err := soak.Run(ctx, soak.Config{
		BinDir:          filepath.Dir(testkit.Binary(t, "relay")),
		Command:         "go test ./itest/soak (TestSoak)",
		DrainTimeout:    5 * time.Minute,
		Duration:        duration,
		FaultInterval:   2 * time.Second,
		OutDir:          out,
		Out:             logWriter{t},
		Rate:            200,
		RecoveryTimeout: 90 * time.Second,
		Seed:            20,
		ServicesScript:  filepath.Join(root, "scripts", "services.sh"),
	})
	if err != nil {
		t.Fatalf("soak: %v (logs in %s)", err, out)
	}
	t.Logf("report (%s):\n%s", out, rep.Text())
	if !rep.OK {
		t.Fatalf("the soak found anomalies: see the report above and the logs in %s", out)
	}
	kills := rep.FaultsByKind[soak.KindRelayKill] + rep.FaultsByKind[soak.KindConsumerKill]
	cuts := rep.FaultsByKind[soak.KindProxyCutPG] + rep.FaultsByKind[soak.KindProxyCutKafka]
	if rep.FaultsByKind[soak.KindBrokerKill] == 0 || rep.FaultsByKind[soak.KindPGRestart] == 0 || cuts == 0 || kills == 0 {
		t.Fatalf("faults %v: want at least one broker kill, database restart, proxy cut and process kill", rep.FaultsByKind)
	}
	if rep.Events.Committed == 0 || rep.Events.AppliedDistinct != rep.Events.Committed {
		t.Fatalf("committed %d, applied %d distinct", rep.Events.Committed, rep.Events.AppliedDistinct)
	}
	// The judge's second opinion, reconcile, read the whole run (up to 40
	// minutes of it).
	if rc := rep.Reconcile; rc == nil || rc.Counts.Committed == 0 ||
		(duration < 30*time.Minute && (rc.Counts.Committed < rep.Events.Committed || rc.Counts.Applied < rep.Events.Committed)) {
		t.Fatalf("reconcile: %+v; want every committed event (%d) read from the outbox and applied", rc, rep.Events.Committed)
	}
	os.RemoveAll(out)
}
