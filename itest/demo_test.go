package itest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestDemo runs `make demo`'s program briefly, as a new user would get it:
// a throwaway PostgreSQL, the embedded Kafka, the real relay and consumer
// binaries, and chaos on. It must exit 0 and its summary must show the
// guarantees: every event applied once, duplicates suppressed, kills
// survived, and the never-filled gap given up with its alert line.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts PostgreSQL and the binaries")
	}
	t.Parallel()
	bin := testkit.Binary(t, "demo")
	cmd := exec.Command(bin, "-bin-dir", filepath.Dir(bin), "-duration", "15s", "-rate", "150", "-gap-timeout", "3s")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("demo ran %s:\n%s", time.Since(start).Round(time.Second), out)
	if err != nil {
		t.Fatalf("demo failed: %v", err)
	}
	for _, want := range []string{
		"== summary",
		"duplicate copies injected",
		"SIGKILLed",
		"gap given up (on-call alerted)   chaos:never-filled seq 3–3",
		`"level":"ERROR","msg":"sequence gap given up`,
		"gap filled in time",
		"OK: side effects executed (",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo summary lacks %q", want)
		}
	}
}

var demoTopic = regexp.MustCompile(`topic (agent-events-[0-9a-f-]+) \(removed at the end\)`)

// TestDemoTwiceOnSharedBroker runs `make demo KAFKA=local`'s program twice in
// a row against the shared real broker. Each run has its own topics and
// group, ends with the same OK verdict, and removes what it created.
func TestDemoTwiceOnSharedBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts PostgreSQL and the binaries against the real broker")
	}
	t.Parallel()
	bin := testkit.Binary(t, "demo")
	brokers := testkit.KafkaBrokers(t)
	adm := kadm.NewClient(testkit.Client(t))
	var topics []string
	for run := 1; run <= 2; run++ {
		cmd := exec.Command(bin, "-bin-dir", filepath.Dir(bin), "-kafka", "local", "-duration", "8s", "-rate", "100", "-gap-timeout", "3s")
		cmd.Env = append(os.Environ(), testkit.EnvKafkaBrokers+"="+brokers)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		t.Logf("run %d took %s:\n%s", run, time.Since(start).Round(time.Second), out)
		if err != nil {
			t.Fatalf("run %d failed: %v", run, err)
		}
		if !strings.Contains(string(out), "\nOK: side effects executed (") {
			t.Fatalf("run %d has no OK verdict", run)
		}
		m := demoTopic.FindSubmatch(out)
		if m == nil {
			t.Fatalf("run %d does not name its topic", run)
		}
		topic := string(m[1])
		topics = append(topics, topic)
		id := strings.TrimPrefix(topic, "agent-events-")
		ckpt, group := "onceflow-demo-"+id+"-checkpoints", "onceflow-demo-"+id
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		listed, err := adm.ListTopics(ctx, topic, ckpt)
		if err != nil {
			t.Fatalf("list topics: %v", err)
		}
		for _, name := range []string{topic, ckpt} {
			if listed.Has(name) {
				t.Errorf("run %d left its topic %s on the broker", run, name)
			}
		}
		groups, err := adm.DescribeGroups(ctx, group)
		cancel()
		if err != nil {
			t.Fatalf("describe group: %v", err)
		}
		if g := groups[group]; g.State != "Dead" && !errors.Is(g.Err, kerr.GroupIDNotFound) {
			t.Errorf("run %d left its consumer group %s (state %q, %d members, err %v)", run, group, g.State, len(g.Members), g.Err)
		}
	}
	if topics[0] == topics[1] {
		t.Errorf("both runs used topic %s", topics[0])
	}
}
