package itest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	console "github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// TestEffectsHTTPStatuses: through the consumer engine with the http
// handler, a 5xx is retried with the same key until it succeeds, a timeout
// likewise (3 s: long enough that a loaded machine never times out the
// others), and a 4xx is retried to the limit and dead-lettered with the
// response in the reason, its business logic never run.
//
// Then the dead letters are replayed (issue 30 item 3), after an operator
// resolved one held effect, another intent was aged past the handler's
// idempotency window and a third held: the dry run lists per event which
// effect a replay would call again, answer from the ledger, refuse as held
// or hold as past its window, and the real replay then sends exactly the
// requests the dry run listed (counted at the server).
func TestEffectsHTTPStatuses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	db := testkit.NewDB(t)
	srv, hs := newIdemServer(t)
	var slowTries atomic.Int32
	var fixed atomic.Bool // the downstream accepts what it rejected
	srv.hang = func(key string) bool { return key == "event:slow" && slowTries.Add(1) == 1 }
	srv.fail = func(key string, n int) int {
		switch {
		case key == "event:flaky" && n <= 2:
			return http.StatusServiceUnavailable
		case strings.HasPrefix(key, "event:rejected") && !fixed.Load():
			return http.StatusUnprocessableEntity
		}
		return 0
	}
	p := filepath.Join(t.TempDir(), "handlers.json")
	cfg := fmt.Sprintf(`{"handlers":[{"event_type":"*","kind":"http","http":{"url":%q,"method":"PUT","timeout":"3s","idempotency_window":"24h"}}]}`, hs.URL)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	h, err := handlerfile.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	topic := testkit.Topic(t, "effstatus", 1, nil)
	cl := testkit.Client(t)
	var evs []envelope.Envelope
	for _, id := range []string{"good", "flaky", "slow", "rejected", "rejected-resolved", "rejected-old", "rejected-held"} {
		evs = append(evs, envelope.Envelope{EventID: id, Source: "s-" + id, Seq: 1, EventType: "x.y", Payload: []byte(`{}`)})
	}
	produce(t, cl, topic, evs...)
	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic},
		BatchHandler: h, RetryMaxAttempts: 3, RetryInitialInterval: 20 * time.Millisecond, RetryMaxInterval: 50 * time.Millisecond})
	eventually(t, 60*time.Second, "3 applied, 4 dead-lettered", func() (bool, string) {
		pr, d := e.metric("onceflow_consumer_processed_total"), e.metric("onceflow_consumer_dead_lettered_total")
		return pr == 3 && d == 4, fmtState("processed ", pr, ", dead ", d)
	})
	// An operator holds one effect (issue 30 item 2): the running consumer's
	// gauges show it, ledger-wide and per scope.
	if ok, err := effects.Hold(context.Background(), db.Pool, effects.ConsumerScope(inbox.DefaultConsumerName, "http", "*"), "event:rejected-held", "operator"); err != nil || !ok {
		t.Fatalf("hold: %v, %v", ok, err)
	}
	eventually(t, 30*time.Second, "the held effect in the gauges", func() (bool, string) {
		n, byScope := e.metric("onceflow_consumer_effects_held"), e.metric("onceflow_consumer_effects_held_by_scope")
		return n == 1 && byScope == 1, fmtState("effects_held ", n, ", by scope ", byScope)
	})
	e.stop(t)

	_, business := srv.snapshot()
	for _, id := range []string{"good", "flaky", "slow"} {
		if business["event:"+id] != 1 {
			t.Errorf("%s: business logic ran %d times, want 1", id, business["event:"+id])
		}
	}
	if business["event:rejected"] != 0 {
		t.Errorf("rejected: business logic ran %d times", business["event:rejected"])
	}
	want := map[string]struct {
		status   string
		attempts int
	}{"good": {"done", 1}, "flaky": {"done", 3}, "slow": {"done", 2}, "rejected": {"intent", 3}}
	for id, w := range want {
		got, ok, err := effects.LookupScoped(context.Background(), db.Pool, effects.ConsumerScope(inbox.DefaultConsumerName, "http", "*"), "event:"+id)
		if err != nil || !ok || got.Status != w.status || got.Attempts != w.attempts || got.EventID != id {
			t.Errorf("%s: ledger %+v (found %v, %v), want status %s attempts %d", id, got, ok, err, w.status, w.attempts)
		}
	}
	var reason string
	if err := db.Pool.QueryRow(context.Background(), `SELECT last_error FROM onceflow.inbox WHERE event_id = 'rejected' AND status = 'dead'`).Scan(&reason); err != nil {
		t.Fatalf("rejected is not dead-lettered: %v", err)
	}
	if !strings.Contains(reason, "http 422") || !strings.Contains(reason, "injected 422") {
		t.Errorf("dead-letter reason %q: want the status and the response body", reason)
	}
	replayDryRunMatchesReplay(t, db, srv, h, &fixed)
}

// replayDryRunMatchesReplay: the dead letters of TestEffectsHTTPStatuses
// (each with an intent of 3 attempts) replayed once the downstream accepts
// them, after an operator resolved one (held, then resolved with what the
// downstream did) and one was aged past the 24h window; one was held
// before (TestEffectsHTTPStatuses).
func replayDryRunMatchesReplay(t *testing.T, db *testkit.DB, srv *idemServer, h inbox.BatchHandler, fixed *atomic.Bool) {
	ctx := context.Background()
	scope := effects.ConsumerScope(inbox.DefaultConsumerName, "http", "*")
	for _, step := range []func() error{
		func() error {
			_, err := effects.Hold(ctx, db.Pool, scope, "event:rejected-resolved", "operator")
			return err
		},
		func() error {
			return effects.Resolve(ctx, db.Pool, scope, "event:rejected-resolved", effects.Result{Code: 201, Summary: []byte(`{"by":"operator"}`)})
		},
		func() error {
			_, err := db.Pool.Exec(ctx, `UPDATE onceflow.effects SET created_at = now() - interval '25 hours' WHERE scope = $1 AND idempotency_key = 'event:rejected-old'`, scope)
			return err
		},
		func() error {
			_, err := effects.Hold(ctx, db.Pool, scope, "event:rejected-held", "operator")
			return err
		},
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	fixed.Store(true)
	svc, err := console.NewService(console.Config{Pool: db.Pool,
		Replay: inbox.ReplayConfig{Handler: h, Pool: db.Pool}.Replay,
		PlannedEffects: func(eventType, eventID string) []effects.Planned {
			return handlerfile.PlannedEffects(h)(inbox.DefaultConsumerName, eventType, eventID)
		}})
	if err != nil {
		t.Fatal(err)
	}
	dry, err := svc.Replay(ctx, console.Caller{Actor: "t", Via: "test"}, console.ReplayRequest{DryRun: true, All: true})
	if err != nil {
		t.Fatal(err)
	}
	wantVerdict := map[string]string{"rejected": effects.VerdictCallAgain, "rejected-resolved": effects.VerdictLedger,
		"rejected-old": effects.VerdictPastWindow, "rejected-held": effects.VerdictHeld}
	listed := map[string]bool{} // keys the dry run says a replay sends
	for _, ev := range dry.Events {
		if len(ev.Effects) != 1 {
			t.Fatalf("dry run of %s: effects %+v, want 1", ev.EventID, ev.Effects)
		}
		fx := ev.Effects[0]
		if fx.Scope != scope || fx.Key != "event:"+ev.EventID || fx.Verdict != wantVerdict[ev.EventID] || fx.WindowSeconds != 86400 {
			t.Errorf("dry run of %s: %+v, want verdict %q", ev.EventID, fx, wantVerdict[ev.EventID])
		}
		if fx.Sends() {
			listed[fx.Key] = true
		}
	}
	if len(dry.Events) != 4 {
		t.Fatalf("dry run listed %d events, want 4", len(dry.Events))
	}
	seen := func() map[string]int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		m := make(map[string]int, len(srv.seen))
		for k, v := range srv.seen {
			m[k] = v
		}
		return m
	}
	before := seen()
	out, err := svc.Replay(ctx, console.Caller{Actor: "t", Via: "test"}, console.ReplayRequest{All: true, RequestID: "r-1", Note: "downstream fixed"})
	if err != nil {
		t.Fatal(err)
	}
	after := seen()
	sent := map[string]bool{}
	for k, n := range after {
		if d := n - before[k]; d > 0 {
			sent[k] = true
			if d != 1 {
				t.Errorf("replay sent %s %d times", k, d)
			}
		}
	}
	if fmt.Sprint(sent) != fmt.Sprint(listed) {
		t.Errorf("the replay sent %v, the dry run listed %v", sent, listed)
	}
	if out.Replayed != 2 || out.Failed != 2 {
		t.Errorf("replay: %d replayed, %d failed, want 2 and 2 (the held and the past-window effects): %+v", out.Replayed, out.Failed, out.Events)
	}
	for key, status := range map[string]string{"event:rejected": effects.StatusDone, "event:rejected-resolved": effects.StatusDone,
		"event:rejected-old": effects.StatusHeld, "event:rejected-held": effects.StatusHeld} {
		if e, _, err := effects.LookupScoped(ctx, db.Pool, scope, key); err != nil || e.Status != status {
			t.Errorf("after the replay %s is %+v (%v), want %s", key, e, err, status)
		}
	}
}

// TestEffectsGraphReexecution: an agent-graph task (thread, node, task path)
// reached again from two different deliveries — different event ids, as
// when a checkpoint is resumed — sends one request with one key and runs the
// downstream's business logic once.
func TestEffectsGraphReexecution(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	db := testkit.NewDB(t)
	srv, hs := newIdemServer(t)
	var sent atomic.Int32
	for _, delivery := range []string{"run-1-event-17", "resumed-run-2-event-93"} {
		key, err := effects.GraphKey("thread-8f2", "charge_card", "0/3/1")
		if err != nil {
			t.Fatal(err)
		}
		r, err := effects.Do(effects.WithEventID(context.Background(), delivery), db.Pool, key, func(ctx context.Context, key string) (effects.Result, error) {
			sent.Add(1)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL, strings.NewReader(`{}`))
			if err != nil {
				return effects.Result{}, err
			}
			req.Header.Set("Idempotency-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return effects.Result{}, err
			}
			resp.Body.Close()
			return effects.Result{Code: resp.StatusCode}, nil
		})
		if err != nil || r.Code != http.StatusCreated {
			t.Fatalf("%s: %+v, %v", delivery, r, err)
		}
	}
	requests, business := srv.snapshot()
	if sent.Load() != 1 || requests != 1 || len(business) != 1 || business["thread-8f2:charge_card:0/3/1"] != 1 {
		t.Fatalf("sent %d, requests %d, business %v: want one effect", sent.Load(), requests, business)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.effects WHERE status = 'done'`); n != 1 {
		t.Fatalf("%d done ledger rows, want 1", n)
	}
}
