package k8s_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// prometheusServer is a real Prometheus (Debian package `prometheus`) on
// loopback with temporary storage, loading the alert rules extracted from
// the PrometheusRule and scraping the given targets every second.
type prometheusServer struct {
	URL  string
	proc *testkit.Proc
}

// startPrometheus starts Prometheus scraping targets (job name -> host:port),
// each target labelled namespace=ns the way the ServiceMonitor does.
func startPrometheus(t *testing.T, ns string, targets map[string]string) *prometheusServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found in PATH (%v): install the Debian package `prometheus` (apt-get install prometheus); .ci/run does", err)
	}
	dir := t.TempDir()
	rules, _ := rulesFile(t)
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg strings.Builder
	cfg.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yaml]\nscrape_configs:\n")
	for _, job := range keys(targets) {
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs:\n      - targets: [%q]\n        labels: {namespace: %q}\n", job, targets[job], ns)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackAddr(t)
	p := testkit.Start(t, "prometheus", bin, nil,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
	)
	srv := &prometheusServer{URL: "http://" + addr, proc: p}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := getUntil(ctx, srv.URL+"/-/ready", func(code int, _ string) bool { return code == 200 }); err != nil {
		t.Fatalf("prometheus never became ready: %v\noutput:\n%s", err, p.Output())
	}
	return srv
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// waitFiring polls /api/v1/alerts until alert is firing and returns its
// labels and annotations.
func (s *prometheusServer) waitFiring(ctx context.Context, t *testing.T, alert string) (map[string]string, map[string]string) {
	t.Helper()
	type apiAlert struct {
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
		State       string            `json:"state"`
	}
	var found apiAlert
	body, err := getUntil(ctx, s.URL+"/api/v1/alerts", func(code int, body string) bool {
		var resp struct {
			Data struct {
				Alerts []apiAlert `json:"alerts"`
			} `json:"data"`
		}
		if code != 200 || json.Unmarshal([]byte(body), &resp) != nil {
			return false
		}
		for _, a := range resp.Data.Alerts {
			if a.Labels["alertname"] == alert && a.State == "firing" {
				found = a
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("alert %s never fired: %v\nlast /api/v1/alerts: %.2000s\nprometheus output (tail):\n%s", alert, err, body, tail(s.proc.Output(), 20))
	}
	return found.Labels, found.Annotations
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var reDeadLettered = regexp.MustCompile(`(?i)dead.?letter`)

// TestDeadLettersAlertFiresInPrometheus is the alert path end to end: a real
// Prometheus scrapes the real consumer (run with the prod overlay's
// settings) whose handler fails, the event is dead-lettered, and the
// DeadLetters alert reaches `firing` with its runbook link.
func TestDeadLettersAlertFiresInPrometheus(t *testing.T) {
	needServices(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testkit.NewDB(t)
	topic := testkit.Topic(t, "deploy-e2e", 1, nil)

	handlers := filepath.Join(t.TempDir(), "handlers.json")
	// A handler that always fails: the event is dead-lettered after one try.
	if err := os.WriteFile(handlers, []byte(`{"handlers":[{"event_type":"*","kind":"sql","sql":"SELECT 1/0"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ct := findContainer(t, "overlays/prod", "Deployment/onceflow-consumer")
	consumer, consumerURL := startFromManifest(t, ct, map[string]string{
		"ONCEFLOW_DATABASE_URL":       db.URL,
		"ONCEFLOW_KAFKA_BROKERS":      testkit.KafkaBrokers(t),
		"ONCEFLOW_TOPICS":             topic,
		"ONCEFLOW_GROUP":              "deploy-e2e-" + topic,
		"ONCEFLOW_HANDLERS_FILE":      handlers,
		"ONCEFLOW_RETRY_MAX_ATTEMPTS": "1",
	})
	prom := startPrometheus(t, "e2e", map[string]string{"onceflow-consumer": strings.TrimPrefix(consumerURL, "http://")})

	// Let Prometheus see the counter at 0 before it moves: increase() needs
	// two samples.
	if _, err := getUntil(ctx, prom.URL+"/api/v1/query?query=onceflow_consumer_dead_lettered_total", func(code int, body string) bool {
		return code == 200 && strings.Contains(body, `"onceflow_consumer_dead_lettered_total"`)
	}); err != nil {
		t.Fatalf("prometheus never scraped the consumer: %v", err)
	}
	if _, err := getUntil(ctx, consumerURL+"/readyz", func(code int, _ string) bool { return code == 200 }); err != nil {
		t.Fatalf("consumer not ready: %v", err)
	}

	ev := envelope.Envelope{EventID: "e2e-1", Source: "e2e-source", Seq: 1, EventType: "e2e.poison",
		ContentType: "application/json", Payload: []byte(`{"n":1}`)}
	if err := testkit.Client(t).ProduceSync(ctx, ev.Record(topic)).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
	if _, err := consumer.WaitFor(ctx, reDeadLettered); err != nil {
		t.Fatalf("consumer never dead-lettered the event: %v", err)
	}
	labels, ann := prom.waitFiring(ctx, t, "DeadLetters")
	if labels["severity"] != "warning" || labels["namespace"] != "e2e" || labels["job"] != "onceflow-consumer" {
		t.Errorf("DeadLetters labels = %v, want severity=warning namespace=e2e job=onceflow-consumer", labels)
	}
	if !strings.HasSuffix(ann["runbook_url"], "docs/runbooks/DeadLetters.md") {
		t.Errorf("DeadLetters runbook_url = %q", ann["runbook_url"])
	}
}
