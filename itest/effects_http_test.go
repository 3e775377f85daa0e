package itest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// idemServer is a downstream API that dedups by Idempotency-Key the way
// Stripe does: the business logic runs once per key, a repeated key gets
// the stored response.
type idemServer struct {
	t        testing.TB
	mu       sync.Mutex
	requests int
	business map[string]int    // key → times the business logic ran
	stored   map[string]string // key → response body
	// fail, when set, answers with this status before any business logic.
	fail func(key string, n int) int
	seen map[string]int
	// hang, when it returns true for a key, makes the request wait until
	// the client gives up (a timeout), before any business logic.
	hang func(key string) bool
}

func newIdemServer(t testing.TB) (*idemServer, *httptest.Server) {
	s := &idemServer{t: t, business: map[string]int{}, stored: map[string]string{}, seen: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	return s, srv
}

func (s *idemServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	if s.hang != nil && s.hang(key) {
		<-r.Context().Done()
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if id := r.Header.Get("X-Onceflow-Event-Id"); id != "" && key != "event:"+id {
		s.t.Errorf("Idempotency-Key %q, want %q", key, "event:"+id)
	}
	s.seen[key]++
	if s.fail != nil {
		if code := s.fail(key, s.seen[key]); code != 0 {
			w.WriteHeader(code)
			fmt.Fprintf(w, `{"error":"injected %d"}`, code)
			return
		}
	}
	if resp, ok := s.stored[key]; ok {
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, resp) //nolint:errcheck
		return
	}
	s.business[key]++
	resp := fmt.Sprintf(`{"charge":%q,"bytes":%d}`, key, len(body))
	s.stored[key] = resp
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, resp) //nolint:errcheck
}

func (s *idemServer) snapshot() (requests int, business map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := make(map[string]int, len(s.business))
	for k, v := range s.business {
		b[k] = v
	}
	return s.requests, b
}

func httpHandlersFile(t *testing.T, url string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "handlers.json")
	body := fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "http", "http": {"url": %q, "timeout": "5s", "headers": {"X-Test": "effects"}}}]}`, url+"/charges")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func effectEvent(i int) envelope.Envelope {
	return envelope.Envelope{
		EventID:   fmt.Sprintf("charge-%03d", i),
		Source:    fmt.Sprintf("payer-%03d", i),
		Seq:       1,
		EventType: "payment.requested",
		Payload:   fmt.Appendf(nil, `{"amount":%d}`, 100+i),
	}
}

// TestEffectsHTTPCrashes runs the consumer binary with the http handler
// against a real local server that dedups by Idempotency-Key, and SIGKILLs
// it 24 times: alternately after the HTTP call before its result is recorded
// (effects-after-call) and after the ledger recorded it before the inbox
// commit (consumer-after-handler), on the N-th hit with N varying 1..4.
// Every event is also produced twice more (redelivery). Afterwards each key
// reached the server's business logic exactly once, the server saw the key
// again after the effects-after-call crashes (the downstream dedup is what
// covers an intent without a result), and the ledger holds exactly one done
// row per event.
func TestEffectsHTTPCrashes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	db := testkit.NewDB(t)
	srv, hs := newIdemServer(t)
	topic := testkit.Topic(t, "effects", 2, nil)
	bin := testkit.Binary(t, "consumer")
	env := []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + topic,
		"ONCEFLOW_TOPICS=" + topic,
		"ONCEFLOW_HANDLERS_FILE=" + httpHandlersFile(t, hs.URL),
		"ONCEFLOW_HTTP_ADDR=",
		"ONCEFLOW_INSTANCE_ID=effects-consumer",
		"ONCEFLOW_BATCH_MAX_RECORDS=2",
		"ONCEFLOW_FAILPOINTS=",
	}
	cl := testkit.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const perRun, crashes = 8, 24
	next := 0
	var all []envelope.Envelope
	for i := range crashes {
		// New events for this run, and a redelivery of earlier ones.
		var evs []envelope.Envelope
		for range perRun {
			evs = append(evs, effectEvent(next))
			next++
		}
		all = append(all, evs...)
		if i > 0 {
			evs = append(evs, all[(i*5)%(len(all)-perRun)], all[(i*7)%(len(all)-perRun)])
		}
		produce(t, cl, topic, evs...)

		fp := "effects-after-call"
		if i%2 == 1 {
			fp = "consumer-after-handler"
		}
		n := 1 + (i/2)%4
		fenv := append(append([]string{}, env...), fmt.Sprintf("ONCEFLOW_FAILPOINTS=%s=%d", fp, n))
		p := testkit.Start(t, fmt.Sprintf("consumer-%d-%s-%d", i, fp, n), bin, fenv, "run")
		select {
		case <-p.Done():
		case <-ctx.Done():
			t.Fatalf("run %d: failpoint %s=%d never fired:\n%s", i, fp, n, p.Output())
		}
		if !strings.Contains(p.Output(), "failpoint "+fp+": SIGKILL") {
			t.Fatalf("run %d: process ended without the failpoint %s:\n%s", i, fp, p.Output())
		}
	}
	// Redeliver everything once more, then run to completion.
	produce(t, cl, topic, all...)
	p := testkit.Start(t, "consumer-final", bin, env, "run")
	eventually(t, 2*time.Minute, "every event processed", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed'`)
		return n == len(all), fmtState(n, " of ", len(all), " processed")
	})
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(60 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.Output())
	}

	requests, business := srv.snapshot()
	if len(business) != len(all) {
		t.Fatalf("business logic ran for %d keys, want %d", len(business), len(all))
	}
	for _, ev := range all {
		if n := business["event:"+ev.EventID]; n != 1 {
			t.Errorf("key event:%s reached the business logic %d times, want 1", ev.EventID, n)
		}
	}
	if requests <= len(all) {
		t.Errorf("%d requests for %d keys: the effects-after-call crashes should have made the consumer send some keys again", requests, len(all))
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.effects`); n != len(all) {
		t.Errorf("%d ledger rows, want %d", n, len(all))
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.effects WHERE status = 'done' AND result_code = 201 AND result ? 'sha256'`); n != len(all) {
		t.Errorf("%d done ledger rows with a 201 summary, want %d", n, len(all))
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.effects WHERE event_id IS DISTINCT FROM substr(idempotency_key, 7)`); n != 0 {
		t.Errorf("%d ledger rows whose event_id does not match the key", n)
	}
	retried := count(t, db, `SELECT count(*) FROM onceflow.effects WHERE attempts > 1`)
	t.Logf("%d events, %d crashes, %d HTTP requests, %d keys sent more than once by an intent-only retry, business logic once per key", len(all), crashes, requests, retried)
}
