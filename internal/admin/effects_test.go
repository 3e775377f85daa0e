package admin

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
)

// TestEffectsAPI: the console's API lists a held effect, refuses to unhold
// one that is not held (409), resolves it (audited), after which it is
// replayed from the ledger and no longer listed.
func TestEffectsAPI(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	if _, err := effects.ClaimLease(ctx, db.Pool, "agent/x", "k1", "ev-1", "o", 60e9); err != nil {
		t.Fatal(err)
	}
	if ok, err := effects.Hold(ctx, db.Pool, "agent/x", "k1", "past the window"); err != nil || !ok {
		t.Fatalf("hold: %v %v", ok, err)
	}
	svc, err := NewService(Config{Pool: db.Pool, Consumer: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := ParseTokens([]byte(tokAlice))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewHandler(svc, toks, slog.New(slog.DiscardHandler)))
	defer srv.Close()
	do := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return resp.StatusCode, m
	}
	code, body := do("GET", "/api/v1/effects/held", "")
	list, _ := body["effects"].([]any)
	if code != 200 || len(list) != 1 || list[0].(map[string]any)["key"] != "k1" || list[0].(map[string]any)["event_id"] != "ev-1" {
		t.Fatalf("held effects: %d %v", code, body)
	}
	if code, body := do("POST", "/api/v1/effects/unhold", `{"request_id":"u1","scope":"agent/x","key":"nope","note":"x"}`); code != http.StatusConflict || body["error_kind"] != "not_held" {
		t.Fatalf("unhold of a missing effect: %d %v", code, body)
	}
	if code, body := do("POST", "/api/v1/effects/resolve", `{"request_id":"r1","scope":"agent/x","key":"k1","note":"found it","code":200,"result":{"id":"x-1"}}`); code != 200 || body["audit_id"] == nil {
		t.Fatalf("resolve: %d %v", code, body)
	}
	if e, _, err := effects.LookupScoped(ctx, db.Pool, "agent/x", "k1"); err != nil || e.Status != effects.StatusDone || e.Result.Code != 200 {
		t.Fatalf("after resolve: %+v, %v", e, err)
	}
	if code, body := do("GET", "/api/v1/effects/held", ""); code != 200 || len(body["effects"].([]any)) != 0 {
		t.Fatalf("held effects after resolve: %d %v", code, body)
	}
}
