package k8s_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/onceflow/onceflow/pkg/seqguard"
)

// wantAlerts are the on-call alerts the PrometheusRule must carry, each
// with a runbook docs/runbooks/<name>.md.
var wantAlerts = []string{
	"CleanupHeldBack", "ConsumerDown", "ConsumerLag", "DeadLetters", "EffectsHeld", "ParkedEventsGrowing", "RelayDown",
	"RelayLagging", "RelayLayoutConflict", "RelayNoLeader", "RelayRowsSetAside", "RelayShardWithoutLeader", "RelaySplitTransaction", "RelayUnqueuedRows",
	"SeqGapGivenUp", "SeqGapOpenLong",
}

const runbookBase = "https://github.com/onceflow/onceflow/blob/main/docs/runbooks/"

// alertRule is one alerting rule as written in the PrometheusRule.
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// rulesFile extracts spec of base/prometheusrule.yaml (the only copy of the
// rules) as a plain Prometheus rules file and returns it with its alerts.
func rulesFile(t *testing.T) ([]byte, []alertRule) {
	t.Helper()
	data, err := os.ReadFile("base/prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Spec map[string]any `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &pr); err != nil {
		t.Fatalf("base/prometheusrule.yaml: %v", err)
	}
	out, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	var groups struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(out, &groups); err != nil {
		t.Fatalf("rules of base/prometheusrule.yaml: %v", err)
	}
	var rules []alertRule
	for _, g := range groups.Groups {
		rules = append(rules, g.Rules...)
	}
	return out, rules
}

// promtool finds the promtool binary or fails naming the package to install.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found in PATH (%v): install the Debian package `prometheus` (apt-get install prometheus); .ci/run does", err)
	}
	return p
}

// TestPromtool runs `promtool check rules` on the rules extracted from the
// PrometheusRule, then `promtool test rules` on alerts/tests.yaml, in which
// every alert fires on synthetic series and stays silent otherwise.
func TestPromtool(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	rules, _ := rulesFile(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("alerts/tests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tests.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "tests.yaml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestAlertTestsCoverEveryAlert: alerts/tests.yaml has, for every alert, an
// evaluation where it fires and one where it must stay silent.
func TestAlertTestsCoverEveryAlert(t *testing.T) {
	t.Parallel()
	_, rules := rulesFile(t)
	data, err := os.ReadFile("alerts/tests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tf struct {
		Tests []struct {
			AlertRuleTest []struct {
				AlertName string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(data, &tf); err != nil {
		t.Fatalf("alerts/tests.yaml: %v", err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.AlertName] = true
			} else {
				silent[a.AlertName] = true
			}
		}
	}
	for _, r := range rules {
		if !fires[r.Alert] {
			t.Errorf("alerts/tests.yaml: no case in which %s fires", r.Alert)
		}
		if !silent[r.Alert] {
			t.Errorf("alerts/tests.yaml: no case in which %s stays silent", r.Alert)
		}
	}
}

// TestAlertsHaveRunbooks: the expected alerts exist, each with severity,
// summary, description and a runbook_url whose file is in docs/runbooks
// with the sections on-call needs; no runbook is orphaned.
func TestAlertsHaveRunbooks(t *testing.T) {
	t.Parallel()
	_, rules := rulesFile(t)
	var names []string
	for _, r := range rules {
		names = append(names, r.Alert)
		if r.Alert == "" {
			t.Errorf("rule %q is not an alerting rule", r.Expr)
			continue
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("%s: severity %q, want critical (pages) or warning", r.Alert, s)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: annotation %s is missing", r.Alert, a)
			}
		}
		if want := runbookBase + r.Alert + ".md"; r.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		body, err := os.ReadFile(filepath.Join("..", "..", "docs", "runbooks", r.Alert+".md"))
		if err != nil {
			t.Errorf("%s: runbook: %v", r.Alert, err)
			continue
		}
		for _, section := range []string{"## What it means", "## Confirm", "## Resolve", "## Escalate"} {
			if !strings.Contains(string(body), section) {
				t.Errorf("docs/runbooks/%s.md has no %q section", r.Alert, section)
			}
		}
		if !strings.HasPrefix(string(body), "# "+r.Alert) {
			t.Errorf("docs/runbooks/%s.md must start with the heading \"# %s\"", r.Alert, r.Alert)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, wantAlerts) {
		t.Errorf("alerts = %v, want %v", names, wantAlerts)
	}
	files, _ := filepath.Glob(filepath.Join("..", "..", "docs", "runbooks", "*.md"))
	for _, f := range files {
		n := strings.TrimSuffix(filepath.Base(f), ".md")
		if n != "README" && !slices.Contains(names, n) {
			t.Errorf("docs/runbooks/%s.md belongs to no alert", n)
		}
	}
}

var metricName = regexp.MustCompile(`\b(onceflow_[a-z0-9_]+|up)\b`)

// ruleMetrics is every metric name the alert expressions use.
func ruleMetrics(rules []alertRule) map[string][]string {
	out := map[string][]string{}
	for _, r := range rules {
		for _, m := range metricName.FindAllString(r.Expr, -1) {
			if !slices.Contains(out[m], r.Alert) {
				out[m] = append(out[m], r.Alert)
			}
		}
	}
	return out
}

// TestSeqGapOpenLongIsHalfTheGapTimeout ties the warning's threshold to the
// gap timeouts the consumer really runs with: ONCEFLOW_GAP_TIMEOUT and
// every ONCEFLOW_GAP_TIMEOUTS class of each overlay (or, unset, the
// sequence guard's default). It must fire at or before half of the smallest,
// and not at once.
func TestSeqGapOpenLongIsHalfTheGapTimeout(t *testing.T) {
	t.Parallel()
	_, rules := rulesFile(t)
	threshold := -1.0
	for _, r := range rules {
		if r.Alert != "SeqGapOpenLong" {
			continue
		}
		m := regexp.MustCompile(`onceflow_consumer_seq_oldest_open_gap_age_seconds\)\s*>\s*([0-9.]+)\s*$`).FindStringSubmatch(strings.TrimSpace(r.Expr))
		if m == nil {
			t.Fatalf("SeqGapOpenLong expr %q: cannot find the `> seconds` threshold", r.Expr)
		}
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		threshold = v
	}
	if threshold < 0 {
		t.Fatal("no SeqGapOpenLong alert")
	}
	for _, dir := range overlays {
		m := build(t, dir)
		smallest := seqguard.DefaultGapTimeout
		where := "seqguard.DefaultGapTimeout"
		if v := envValue(m, m.Deployments["onceflow-consumer"], "ONCEFLOW_GAP_TIMEOUT"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("%s: ONCEFLOW_GAP_TIMEOUT %q: %v", dir, v, err)
			}
			smallest, where = d, "ONCEFLOW_GAP_TIMEOUT"
		}
		if v := envValue(m, m.Deployments["onceflow-consumer"], "ONCEFLOW_GAP_TIMEOUTS"); v != "" {
			for _, class := range strings.Split(v, ",") {
				_, dur, ok := strings.Cut(strings.TrimSpace(class), "=")
				d, err := time.ParseDuration(dur)
				if !ok || err != nil {
					t.Fatalf("%s: ONCEFLOW_GAP_TIMEOUTS entry %q is not glob=duration", dir, class)
				}
				if d < smallest {
					smallest, where = d, "ONCEFLOW_GAP_TIMEOUTS "+class
				}
			}
		}
		if half := (smallest / 2).Seconds(); threshold <= 0 || threshold > half {
			t.Errorf("%s: SeqGapOpenLong fires at %gs; want (0, %gs], half of the smallest gap timeout (%s, %s)", dir, threshold, half, smallest, where)
		}
	}
}
