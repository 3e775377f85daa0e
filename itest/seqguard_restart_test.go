package itest

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
)

var httpLine = regexp.MustCompile(`"msg":"http listening","addr":"([^"]+)"`)

// scrape returns the value of an unlabelled metric from a binary's /metrics.
func scrape(t *testing.T, addr, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	return "absent"
}

// TestSeqGuardGapSurvivesRestart: the consumer binary parks 4 and 5 behind
// the missing 3 and is SIGKILLed with the gap open. A fresh process gives
// the gap up exactly once after its timeout (one given-up row, one ERROR
// line across both processes, its counter at 1) and applies the parked
// events, which survived in Postgres. Then the on-call commands: `gaps
// list` shows the gap, `gaps resolve` records a note.
func TestSeqGuardGapSurvivesRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := seqDB(t)
	topic := testkit.Topic(t, "seq-restart", 1, nil)
	bin := testkit.Binary(t, "consumer")
	env := []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + topic,
		"ONCEFLOW_TOPICS=" + topic,
		"ONCEFLOW_HANDLERS_FILE=" + seqHandlersFile(t),
		"ONCEFLOW_HTTP_ADDR=127.0.0.1:0",
		"ONCEFLOW_GAP_TIMEOUT=4s",
		"ONCEFLOW_GAP_CHECK_INTERVAL=100ms",
		// Static membership: the restart takes the partition back without
		// waiting for the killed member's session to time out.
		"ONCEFLOW_INSTANCE_ID=seq-restart",
		"ONCEFLOW_FAILPOINTS=",
	}
	produce(t, testkit.Client(t), topic, testEvent("r", 1), testEvent("r", 2), testEvent("r", 4), testEvent("r", 5))

	p1 := testkit.Start(t, "consumer-1", bin, env, "run")
	eventually(t, 30*time.Second, "4 and 5 parked behind the open gap 3", func() (bool, string) {
		parked := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'parked'`)
		open := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'open' AND from_seq = 3 AND to_seq = 3`)
		return parked == 2 && open == 1, fmtState("parked ", parked, " open gaps ", open)
	})
	p1.Kill()
	<-p1.Done()
	if n := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'open'`); n != 1 {
		t.Fatalf("the gap was closed before the kill (%d open): raise the gap timeout", n)
	}

	p2 := testkit.Start(t, "consumer-2", bin, env, "run")
	line, err := p2.WaitFor(ctx, httpLine)
	if err != nil {
		t.Fatalf("consumer-2: %v\n%s", err, p2.Output())
	}
	addr := httpLine.FindStringSubmatch(line)[1]
	// A fresh process exports the guard totals at 0.
	if v := scrape(t, addr, "onceflow_consumer_seq_gaps_given_up_total"); v != "0" && v != "1" {
		t.Fatalf("given_up_total on start: %s", v)
	}
	eventually(t, 60*time.Second, "the gap given up and 4, 5 applied", func() (bool, string) {
		o := appliedOrder(t, db, "r")
		g := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`)
		return o == "1 2 4 5" && g == 1, fmtState("applied ", o, " given-up rows ", g)
	})
	eventually(t, 30*time.Second, "the counter at 1", func() (bool, string) {
		v := scrape(t, addr, "onceflow_consumer_seq_gaps_given_up_total")
		return v == "1", "given_up_total " + v
	})
	out, err := runBinErr(bin, env, "gaps", "list")
	if err != nil || !strings.Contains(out, "r  ") || !strings.Contains(out, "3-3") || !strings.Contains(out, "given_up") || !strings.Contains(out, "timeout") {
		t.Fatalf("gaps list: %v\n%s", err, out)
	}
	if out := runBin(t, bin, env, "gaps", "resolve", "r", "3-3", "-note", "seq 3 was never written (INC-1)"); !strings.Contains(out, "resolved 1 gap") {
		t.Fatalf("gaps resolve: %s", out)
	}
	if out, err := runBinErr(bin, env, "gaps", "resolve", "r", "3-3", "-note", "again"); err == nil {
		t.Fatalf("second resolve succeeded: %s", out)
	}
	if out := runBin(t, bin, env, "gaps", "list"); !strings.Contains(out, "INC-1") {
		t.Fatalf("gaps list after resolve:\n%s", out)
	}
	p2.Signal(syscall.SIGTERM)
	if err := p2.Wait(60 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p2.Output())
	}
	if n := len(matching(p1.Output()+"\n"+p2.Output(), givenUpMsg, `"source":"r"`, `"range":"3-3"`)); n != 1 {
		t.Fatalf("%d give-up ERROR lines across both processes, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status <> 'processed'`); n != 0 {
		t.Fatalf("%d inbox rows not processed", n)
	}
}
