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

// TestRetentionSeqGuardCatchesPrunedRedelivery: under deliver-late and
// under hold, events 1-3 and 5-6 of a source are applied (4 never comes: its
// gap is given up), their inbox rows aged past a 1h TTL and pruned by
// `consumer prune`; then the whole topic is redelivered (a new group reads
// it from the start) and 4 finally arrives. The redelivered events were
// applied in order, so they are duplicates — the handler runs once per
// event under both policies; only 4, inside the given-up range, is late
// (applied marked late, or held).
func TestRetentionSeqGuardCatchesPrunedRedelivery(t *testing.T) {
	t.Parallel()
	for _, late := range []seqguard.Late{seqguard.DeliverLate, seqguard.Hold} {
		t.Run(late.String(), func(t *testing.T) {
			t.Parallel()
			db := seqDB(t)
			ctx := context.Background()
			topic := testkit.Topic(t, "retention", 1, nil)
			cl := testkit.Client(t)
			for _, seq := range []int64{1, 2, 3, 5, 6} {
				produce(t, cl, topic, testEvent("acct-1", seq))
			}
			cfg := inbox.Config{Pool: db.Pool, Group: "g1-" + topic, Topics: []string{topic}, BatchHandler: seqHandler(t),
				LatePolicy: late, GapTimeout: time.Second, GapCheckInterval: 50 * time.Millisecond}
			e := startEngine(t, cfg)
			eventually(t, 30*time.Second, "1-3, 5-6 applied after 4 was given up", func() (bool, string) {
				o := appliedOrder(t, db, "acct-1")
				return o == "1 2 3 5 6", "applied " + o
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
			produce(t, cl, topic, testEvent("acct-1", 4))
			cfg.Group = "g2-" + topic
			e2 := startEngine(t, cfg)
			wantOrder, wantStatus := "1 2 3 5 6 4L", "processed"
			if late == seqguard.Hold {
				wantOrder, wantStatus = "1 2 3 5 6", "held"
			}
			eventually(t, 30*time.Second, "5 duplicates and 4 late", func() (bool, string) {
				d, l, h := e2.metric("onceflow_consumer_duplicates_total"), e2.metric("onceflow_consumer_late_events_total"), e2.metric("onceflow_consumer_held_total")
				return d == 5 && l+h == 1, fmtState("duplicates ", d, " late ", l, " held ", h)
			})
			e2.stop(t)
			if o := appliedOrder(t, db, "acct-1"); o != wantOrder {
				t.Fatalf("handler runs %q, want %q (once per event)", o, wantOrder)
			}
			if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE event_id = 'acct-1-4' AND late AND status = $1`, wantStatus); n != 1 {
				t.Fatalf("acct-1-4 is not %s late", wantStatus)
			}
			if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed' AND NOT late`); n != 5 {
				t.Fatalf("%d redelivered events back in the inbox as processed, want 5", n)
			}
			if p := e2.metric("onceflow_consumer_processed_total"); p != float64(strings.Count(wantOrder, "L")) {
				t.Fatalf("processed_total %v after the redelivery", p)
			}
			t.Logf("%s: 5 applied, 5 pruned, 5 redelivered as duplicates, seq 4 late (%s)", late, wantStatus)
		})
	}
}
