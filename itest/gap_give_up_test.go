package itest

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestGapGiveUpNow: an operator gives an open gap up without waiting for its
// timeout (an hour here). The consumer binary parks 4, 5 and 7 behind the
// open gaps 3 and 6; `consumer gaps give-up r 6-6` asks for 6 and, since gaps
// go in seq order, for 3 below it; the running consumer gives both up at its
// next gap check (reason operator, the requester recorded), applies 4, 5 and
// 7, and the request is in the audit. A give-up that meets no open gap fails
// and names `gaps list`; `gaps list` shows who asked; `gaps resolve` then
// closes the incident as for any given-up gap.
func TestGapGiveUpNow(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := seqDB(t)
	topic := testkit.Topic(t, "gap-give-up", 1, nil)
	bin := testkit.Binary(t, "consumer")
	env := []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + topic,
		"ONCEFLOW_TOPICS=" + topic,
		"ONCEFLOW_HANDLERS_FILE=" + seqHandlersFile(t),
		"ONCEFLOW_HTTP_ADDR=127.0.0.1:0",
		"ONCEFLOW_GAP_TIMEOUT=1h",
		"ONCEFLOW_GAP_CHECK_INTERVAL=100ms",
		"ONCEFLOW_FAILPOINTS=",
	}
	produce(t, testkit.Client(t), topic, testEvent("r", 1), testEvent("r", 2), testEvent("r", 4), testEvent("r", 5), testEvent("r", 7))
	p := testkit.Start(t, "consumer", bin, env, "run")
	if _, err := p.WaitFor(ctx, httpLine); err != nil {
		t.Fatalf("consumer: %v\n%s", err, p.Output())
	}
	eventually(t, 30*time.Second, "4, 5 and 7 parked behind the open gaps 3 and 6", func() (bool, string) {
		parked := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'parked'`)
		open := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'open'`)
		return parked == 3 && open == 2, fmtState("parked ", parked, " open gaps ", open)
	})

	if out, err := runBinErr(bin, env, "gaps", "give-up", "r", "9-9", "-note", "nothing there"); err == nil || !strings.Contains(out, "no open gap meets that range") {
		t.Fatalf("give-up of a range with no open gap: %v\n%s", err, out)
	}
	t0 := time.Now()
	out := runBin(t, bin, env, "gaps", "give-up", "r", "6-6", "-note", "rows skipped at the producer (INC-7)", "-actor", "alice")
	if !strings.Contains(out, "gap(s) 3-3, 6-6 to be given up now") {
		t.Fatalf("gaps give-up: %s", out)
	}
	eventually(t, 30*time.Second, "both gaps given up and 4, 5, 7 applied", func() (bool, string) {
		o := appliedOrder(t, db, "r")
		g := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up' AND give_up_reason = 'operator'
  AND give_up_requested_by = 'alice via cli'`)
		return o == "1 2 4 5 7" && g == 2, fmtState("applied ", o, " given up by the operator ", g)
	})
	t.Logf("given up %s after the request (gap timeout 1h)", time.Since(t0).Round(time.Millisecond))
	if n := count(t, db, `SELECT count(*) FROM onceflow.admin_audit WHERE action = 'gap.give_up' AND actor = 'alice' AND outcome = 'ok'`); n != 1 {
		t.Fatalf("%d audit rows for the give-up, want 1", n)
	}
	if out := runBin(t, bin, env, "gaps", "list"); !strings.Contains(out, "operator (alice via cli)") {
		t.Fatalf("gaps list after the give-up:\n%s", out)
	}
	if out := runBin(t, bin, env, "gaps", "resolve", "r", "3-6", "-note", "INC-7 closed"); !strings.Contains(out, "resolved 2 gap") {
		t.Fatalf("gaps resolve: %s", out)
	}
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(60 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.Output())
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status <> 'processed'`); n != 0 {
		t.Fatalf("%d inbox rows not processed", n)
	}
}
