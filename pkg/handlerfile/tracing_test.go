package handlerfile

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// The http handler's span describes the endpoint by method, scheme, host and
// port only: never the path's query or the userinfo, which may hold secrets.
func TestHTTPSpanAttrsHideSecrets(t *testing.T) {
	t.Parallel()
	attrs := httpSpanAttrs("POST", "https://user:pass@api.example:8443/charges?api_key=secret")
	got := map[string]string{}
	for _, kv := range attrs {
		got[string(kv.Key)] = kv.Value.String()
	}
	want := map[string]string{"http.request.method": "POST", "url.scheme": "https", "server.address": "api.example", "server.port": "8443"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	for k, v := range got {
		if strings.Contains(v, "secret") || strings.Contains(v, "pass") {
			t.Errorf("attribute %s shows a secret: %q", k, v)
		}
	}
}

// Outside a traced engine (no process span), the http handler starts no span
// but its call still carries the producer's traceparent, so the downstream
// joins the producer's trace. (The spans themselves are checked end to end by
// itest.TestTracingEndToEnd against the real binaries.)
func TestHTTPCallCarriesProducerTraceparent(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	var mu sync.Mutex
	seen := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("Idempotency-Key")] = r.Header.Get("traceparent")
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	db := testkit.NewDB(t)
	ctx := context.Background()
	h, err := Parse(fmt.Appendf(nil, `{"handlers": [{"event_type": "pay", "kind": "http", "http": {"url": %q}}]}`, srv.URL+"/charges"))
	if err != nil {
		t.Fatal(err)
	}
	hh := h.(*effecting).byType["pay"].http
	t.Cleanup(func() {
		if hh.pool != nil {
			hh.pool.Close()
		}
	})
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ev := inbox.Event{Envelope: envelope.Envelope{EventID: "p-1", Source: "p", Seq: 1, EventType: "pay", Traceparent: tp, Payload: []byte(`{}`)}}
	if err := h.HandleBatch(ctx, tx, []inbox.Event{ev}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := seen["event:p-1"]
	mu.Unlock()
	if got != tp {
		t.Fatalf("server saw traceparent %q, want the producer's %q", got, tp)
	}
}
