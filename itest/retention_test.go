package itest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRetentionStartRejectsShortTTL (test 4): `consumer run` with a class
// TTL shorter than the horizon of a source that sends that class exits 2
// before connecting, naming the class and the source.
func TestRetentionStartRejectsShortTTL(t *testing.T) {
	t.Parallel()
	bin := testkit.Binary(t, "consumer")
	ret := writeFile(t, "retention.json", `{"classes":[{"match":"webhook.*","keep":"24h"},{"match":"*","keep":"permanent"}],
	  "sources":[{"source":"stripe-webhooks","horizon":"72h","event_types":["webhook.charge"]}]}`)
	cmd := exec.Command(bin, "run")
	cmd.Env = append(os.Environ(),
		"ONCEFLOW_DATABASE_URL=postgres://nobody@127.0.0.1:1/none",
		"ONCEFLOW_KAFKA_BROKERS=127.0.0.1:1",
		"ONCEFLOW_GROUP=g", "ONCEFLOW_TOPICS=t",
		"ONCEFLOW_HANDLERS_FILE="+writeFile(t, "h.json", `{"handlers":[{"event_type":"*","kind":"log"}]}`),
		"ONCEFLOW_RETENTION_FILE="+ret)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("consumer run: %v, want exit status 2\n%s", err, out)
	}
	for _, want := range []string{"-retention-file (ONCEFLOW_RETENTION_FILE)", `class "webhook.*" keeps 24h0m0s`, `source "stripe-webhooks"'s redelivery horizon 72h0m0s`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
}

// TestRetentionSeqGuardCatchesPrunedRedelivery: events applied, their inbox
// rows aged past a 1h TTL and pruned by `consumer prune`; the same events
// redelivered (a new group reads the topic from the start) are not applied
// again: the sequence guard, whose state is never pruned, holds them as late.
func TestRetentionSeqGuardCatchesPrunedRedelivery(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	ctx := context.Background()
	topic := testkit.Topic(t, "retention", 1, nil)
	cl := testkit.Client(t)
	want := map[string]bool{}
	for seq := int64(1); seq <= 5; seq++ {
		ev := testEvent("acct-1", seq)
		want[ev.EventID] = true
		produce(t, cl, topic, ev)
	}
	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g1-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t)})
	eventually(t, 30*time.Second, "5 applied", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed'`)
		return n == 5, fmtState(n, " processed")
	})
	e.stop(t)
	if _, err := db.Pool.Exec(ctx, `UPDATE onceflow.inbox SET received_at = now() - interval '2h'`); err != nil {
		t.Fatal(err)
	}
	ret := writeFile(t, "retention.json", `{"classes":[{"match":"test.*","keep":"1h"}]}`)
	out, err := exec.Command(testkit.Binary(t, "consumer"), "prune", "-database-url", db.URL, "-retention-file", ret, "-batch-size", "2").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "pruned inbox 5, effects 0, outbox 0") {
		t.Fatalf("consumer prune: %v\n%s", err, out)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox`); n != 0 {
		t.Fatalf("%d inbox rows after pruning, want 0", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.seq_state WHERE source = 'acct-1' AND last_applied = 5`); n != 1 {
		t.Fatalf("seq state of acct-1 not at 5 after pruning")
	}
	e2 := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g2-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t), LatePolicy: seqguard.Hold})
	eventually(t, 30*time.Second, "5 redelivered events held as late", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'held' AND late`)
		return n == 5, fmtState(n, " held")
	})
	e2.stop(t)
	checkEffects(t, db, want) // each applied exactly once
}
