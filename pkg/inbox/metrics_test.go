package inbox

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetricsLint(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.processed.Inc()
	m.setLag("orders", 3, 12)
	m.batchSize.Observe(10)
	m.batchDuration.Observe(0.01)
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	n, err := testutil.GatherAndCount(reg)
	if err != nil || n == 0 {
		t.Fatalf("gathered %d metrics, err %v", n, err)
	}
}

// The guard's metrics exist from start, at 0, under the names the alert
// rules use (deploy/k8s/base/prometheusrule.yaml).
func TestMetricsGuardExportedFromStart(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = len(mf.GetMetric()) == 1
	}
	for _, name := range []string{
		"onceflow_consumer_seq_gaps_open", "onceflow_consumer_seq_oldest_open_gap_age_seconds",
		"onceflow_consumer_parked_events", "onceflow_consumer_held_events", "onceflow_consumer_effects_held",
		"onceflow_consumer_parked_total", "onceflow_consumer_late_events_total", "onceflow_consumer_held_total",
		"onceflow_consumer_seq_gaps_opened_total", "onceflow_consumer_seq_gaps_given_up_total",
	} {
		if !got[name] {
			t.Errorf("%s is not exported from start", name)
		}
	}
}

// A second consumer on the same registry is an error from New, never a
// panic in the host program.
func TestMetricsRegisteredTwiceIsAnError(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := newMetrics(reg); err == nil {
		t.Fatal("registering the consumer's metrics twice: no error")
	}
}
