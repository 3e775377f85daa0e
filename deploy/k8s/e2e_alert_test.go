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

// e2e is a real consumer, run with the prod overlay's settings against the
// test services, scraped every second by a real Prometheus that loads the
// alert rules.
type e2e struct {
	ctx      context.Context
	topic    string
	consumer *testkit.Proc
	prom     *prometheusServer
}

// startE2E starts the consumer with handlersJSON and the extra settings,
// then Prometheus, and waits until Prometheus has scraped the consumer's
// metric seen (at its initial value: increase() needs a sample from before
// the event) and the consumer is ready.
func startE2E(t *testing.T, handlersJSON string, extra map[string]string, seen string) *e2e {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	db := testkit.NewDB(t)
	topic := testkit.Topic(t, "deploy-e2e", 1, nil)
	handlers := filepath.Join(t.TempDir(), "handlers.json")
	if err := os.WriteFile(handlers, []byte(handlersJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"ONCEFLOW_DATABASE_URL":  db.URL,
		"ONCEFLOW_KAFKA_BROKERS": testkit.KafkaBrokers(t),
		"ONCEFLOW_TOPICS":        topic,
		"ONCEFLOW_GROUP":         "deploy-e2e-" + topic,
		"ONCEFLOW_HANDLERS_FILE": handlers,
	}
	for k, v := range extra {
		env[k] = v
	}
	ct := findContainer(t, "overlays/prod", "Deployment/onceflow-consumer")
	consumer, consumerURL := startFromManifest(t, ct, env)
	prom := startPrometheus(t, "e2e", map[string]string{"onceflow-consumer": strings.TrimPrefix(consumerURL, "http://")})
	if _, err := getUntil(ctx, prom.URL+"/api/v1/query?query="+seen, func(code int, body string) bool {
		return code == 200 && strings.Contains(body, `"`+seen+`"`)
	}); err != nil {
		t.Fatalf("prometheus never scraped %s from the consumer: %v", seen, err)
	}
	if _, err := getUntil(ctx, consumerURL+"/readyz", func(code int, _ string) bool { return code == 200 }); err != nil {
		t.Fatalf("consumer not ready: %v", err)
	}
	return &e2e{ctx: ctx, topic: topic, consumer: consumer, prom: prom}
}

func (e *e2e) produce(t *testing.T, evs ...envelope.Envelope) {
	t.Helper()
	cl := testkit.Client(t)
	for _, ev := range evs {
		if err := cl.ProduceSync(e.ctx, ev.Record(e.topic)).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", ev.EventID, err)
		}
	}
}

// checkFired waits for alert to fire and checks its labels and runbook.
func (e *e2e) checkFired(t *testing.T, alert, severity string) {
	t.Helper()
	labels, ann := e.prom.waitFiring(e.ctx, t, alert)
	if labels["severity"] != severity || labels["namespace"] != "e2e" || labels["job"] != "onceflow-consumer" {
		t.Errorf("%s labels = %v, want severity=%s namespace=e2e job=onceflow-consumer", alert, labels, severity)
	}
	if !strings.HasSuffix(ann["runbook_url"], "docs/runbooks/"+alert+".md") {
		t.Errorf("%s runbook_url = %q", alert, ann["runbook_url"])
	}
}

func event(source string, seq int64) envelope.Envelope {
	return envelope.Envelope{EventID: fmt.Sprintf("%s-%d", source, seq), Source: source, Seq: seq,
		EventType: "e2e.test", ContentType: "application/json", Payload: []byte(`{"n":1}`)}
}

var (
	reDeadLettered = regexp.MustCompile(`"msg":"event dead-lettered"`)
	reGapGivenUp   = regexp.MustCompile(`"level":"ERROR","msg":"sequence gap given up`)
)

// TestSeqGapGivenUpAlertFiresInPrometheus is the on-call path of C4 end to
// end: the real consumer (sequence guards on, gap timeout shortened to 2s)
// gets seq 1 and 3 of a source, gives the gap 2–2 up, and the SeqGapGivenUp
// alert, evaluated by a real Prometheus scraping it, reaches `firing`.
func TestSeqGapGivenUpAlertFiresInPrometheus(t *testing.T) {
	needServices(t)
	t.Parallel()
	e := startE2E(t, `{"handlers":[{"event_type":"*","kind":"log"}]}`, map[string]string{
		"ONCEFLOW_GAP_TIMEOUT":        "2s",
		"ONCEFLOW_GAP_CHECK_INTERVAL": "200ms",
	}, "onceflow_consumer_seq_gaps_given_up_total")
	e.produce(t, event("e2e-source", 1), event("e2e-source", 3))
	if _, err := e.consumer.WaitFor(e.ctx, reGapGivenUp); err != nil {
		t.Fatalf("consumer never gave the gap up: %v", err)
	}
	e.checkFired(t, "SeqGapGivenUp", "critical")
}

// TestDeadLettersAlertFiresInPrometheus: the real consumer's handler fails,
// the event is dead-lettered after one try, and DeadLetters fires in a real
// Prometheus.
func TestDeadLettersAlertFiresInPrometheus(t *testing.T) {
	needServices(t)
	t.Parallel()
	e := startE2E(t, `{"handlers":[{"event_type":"*","kind":"sql","sql":"SELECT 1/0"}]}`, map[string]string{
		"ONCEFLOW_RETRY_MAX_ATTEMPTS": "1",
	}, "onceflow_consumer_dead_lettered_total")
	e.produce(t, event("e2e-poison", 1))
	if _, err := e.consumer.WaitFor(e.ctx, reDeadLettered); err != nil {
		t.Fatalf("consumer never dead-lettered the event: %v", err)
	}
	e.checkFired(t, "DeadLetters", "warning")
}
