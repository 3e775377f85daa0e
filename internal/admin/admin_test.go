package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/inbox/status"
)

const (
	tokAlice = "alice-token-0123456789abcdef"
	tokCI    = "ci-token-fedcba9876543210xyz"
)

func TestParseTokens(t *testing.T) {
	t.Parallel()
	good := "# on-call\n" + tokAlice + "\n\n  ci   " + tokCI + "  \n"
	toks, err := ParseTokens([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(toks.Names(), ","); got != "operator,ci" {
		t.Fatalf("names %q", got)
	}
	for _, c := range []struct {
		presented, name string
		ok              bool
	}{
		{tokAlice, "operator", true},
		{tokCI, "ci", true},
		{"", "", false},
		{tokAlice[:len(tokAlice)-1], "", false},
		{tokAlice + "x", "", false},
		{"ci", "", false},
	} {
		name, ok := toks.Check(c.presented)
		if name != c.name || ok != c.ok {
			t.Errorf("Check(%q) = %q %v, want %q %v", c.presented, name, ok, c.name, c.ok)
		}
	}
	for _, c := range []struct{ data, want string }{
		{"", "no token"},
		{"# only a comment\n", "no token"},
		{"short", "line 1: the token is 5 characters, at least 16"},
		{"a b c", "line 1: want TOKEN or NAME TOKEN"},
		{"bad/name " + tokAlice, `line 1: name "bad/name"`},
		{"x " + tokAlice + "\nx " + tokCI, `line 2: name "x" is used twice`},
		{"x " + tokAlice + "\ny " + tokAlice, "line 2: the token of \"y\" is also another line's"},
		{"x " + tokAlice + "\u00e9", "outside printable ASCII"},
	} {
		_, err := ParseTokens([]byte(c.data))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseTokens(%q): %v, want an error containing %q", c.data, err, c.want)
		}
		if err != nil && (strings.Contains(err.Error(), tokAlice) || strings.Contains(err.Error(), tokCI)) {
			t.Errorf("ParseTokens error repeats a token: %v", err)
		}
	}
	if _, err := LoadTokens(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("LoadTokens of a missing file succeeded")
	}
}

func TestFlagsValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		f    Flags
		want string
	}{
		{Flags{}, ""},
		{Flags{Enabled: true, Addr: "127.0.0.1:9091"}, "-admin-token-file (ONCEFLOW_ADMIN_TOKEN_FILE) is required"},
		{Flags{Enabled: true, Addr: "nohost", TokenFile: "/x"}, "-admin-addr (ONCEFLOW_ADMIN_ADDR)"},
		{Flags{Enabled: true, Addr: "127.0.0.1:0", TokenFile: "/x"}, ""},
	} {
		err := c.f.Validate()
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", c.f, err, c.want)
		}
	}
}

func TestFilterParams(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	f, err := FilterParams{Status: "dead, held", EventType: " billing.* ", Since: "2h", To: "2026-03-04T11:30:00Z", Group: "0123456789ab"}.Filter(now)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.Statuses, []status.Status{status.Dead, status.Held}) || f.EventType != "billing.*" || !f.ReceivedFrom.Equal(now.Add(-2*time.Hour)) ||
		!f.ReceivedTo.Equal(now.Add(-30*time.Minute)) || f.Group != "0123456789ab" {
		t.Fatalf("filter %+v", f)
	}
	for _, c := range []struct {
		p    FilterParams
		want string
	}{
		{FilterParams{From: "yesterday"}, `from "yesterday"`},
		{FilterParams{To: "1"}, `to "1"`},
		{FilterParams{Since: "-1h"}, `since "-1h"`},
		{FilterParams{Since: "1h", From: "2026-01-01T00:00:00Z"}, "give one of them"},
		{FilterParams{Status: "processed"}, `status "processed"`},
		{FilterParams{Group: "G"}, `group "G"`},
		{FilterParams{From: "2026-01-02T00:00:00Z", To: "2026-01-01T00:00:00Z"}, "is not before"},
	} {
		if _, err := c.p.Filter(now); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.p, err, c.want)
		}
	}
	q := FilterFromQuery(map[string][]string{"event_type": {"a.*"}, "error": {"boom"}, "unknown": {"x"}})
	if q != (FilterParams{EventType: "a.*", Error: "boom"}) {
		t.Errorf("from query: %+v", q)
	}
}

// testHandler is the consumer's handler over a pool that never connects
// (the endpoints used here do not touch the database).
func testHandler(t *testing.T) (http.Handler, *bytes.Buffer) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc, err := NewService(Config{Pool: pool, Consumer: "c1", Group: "g1"})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := ParseTokens([]byte(tokAlice + "\nci " + tokCI))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	return NewHandler(svc, toks, slog.New(slog.NewJSONHandler(&logs, nil))), &logs
}

// TestAuthRefusesWithoutToken: every API endpoint answers 401 without a
// token or with a wrong one, and never logs what was presented.
func TestAuthRefusesWithoutToken(t *testing.T) {
	t.Parallel()
	h, logs := testHandler(t)
	srv := httptest.NewServer(h)
	defer srv.Close()
	do := func(method, path, auth string, body string) (*http.Response, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(ActorHeader, " Bob\tthe\u200b operator ")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &m)
		return resp, m
	}
	endpoints := [][2]string{{"GET", "/api/v1/session"}, {"GET", "/api/v1/summary"}, {"GET", "/api/v1/gaps"},
		{"POST", "/api/v1/gaps/resolve"}, {"GET", "/api/v1/dead-letters"}, {"GET", "/api/v1/dead-letters/groups"},
		{"POST", "/api/v1/dead-letters/replay"}, {"GET", "/api/v1/held"}, {"GET", "/api/v1/lag"}, {"GET", "/api/v1/relay"},
		{"GET", "/api/v1/audit"}, {"GET", "/api/v1/effects/held"}, {"POST", "/api/v1/effects/resolve"},
		{"POST", "/api/v1/effects/unhold"}, {"GET", "/api/v1/nope"}}
	wrong := "not-the-token-but-long-enough"
	for _, ep := range endpoints {
		for _, auth := range []string{"", "Bearer", "Bearer " + wrong, "Basic " + tokAlice, tokAlice, "Bearer " + tokAlice + " "} {
			if auth == "Bearer "+tokAlice+" " {
				continue // trimmed: valid (checked below)
			}
			resp, body := do(ep[0], ep[1], auth, `{}`)
			if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" || body["error"] == nil {
				t.Errorf("%s %s with Authorization %q: %d %v, want 401 with WWW-Authenticate", ep[0], ep[1], auth, resp.StatusCode, body)
			}
		}
	}
	resp, body := do("GET", "/api/v1/session", "Bearer "+tokCI, "")
	if resp.StatusCode != 200 || body["via"] != "api:ci" || body["actor"] != "Bob the operator" || body["consumer"] != "c1" {
		t.Errorf("session with the ci token: %d %v", resp.StatusCode, body)
	}
	if resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("API answers are cacheable: %q", resp.Header.Get("Cache-Control"))
	}
	resp, body = do("GET", "/api/v1/session", "Bearer "+tokAlice, "")
	if resp.StatusCode != 200 || body["via"] != "api:operator" {
		t.Errorf("session with the operator token: %d %v", resp.StatusCode, body)
	}
	resp, _ = do("GET", "/api/v1/nope", "Bearer "+tokAlice, "")
	if resp.StatusCode != 404 {
		t.Errorf("unknown endpoint: %d", resp.StatusCode)
	}
	resp, body = do("POST", "/api/v1/dead-letters/replay", "Bearer "+tokAlice, `{"unknown": 1}`)
	if resp.StatusCode != 400 || !strings.Contains(body["error"].(string), "unknown") {
		t.Errorf("unknown field: %d %v", resp.StatusCode, body)
	}
	resp, body = do("POST", "/api/v1/dead-letters/replay", "Bearer "+tokAlice, `{"request_id": "r1"}`)
	if resp.StatusCode != 400 || !strings.Contains(body["error"].(string), "say what to replay") {
		t.Errorf("replay of nothing: %d %v", resp.StatusCode, body)
	}
	resp, body = do("POST", "/api/v1/dead-letters/replay", "Bearer "+tokAlice, `{"request_id": "r1", "all": true}`)
	if resp.StatusCode != 400 || !strings.Contains(body["error"].(string), "note is required") {
		t.Errorf("bulk replay without a note: %d %v", resp.StatusCode, body)
	}
	resp, body = do("POST", "/api/v1/gaps/resolve", "Bearer "+tokAlice, `{"request_id": "r2", "source": "s", "from": 3, "to": 2, "note": "x"}`)
	if resp.StatusCode != 400 || !strings.Contains(body["error"].(string), "range 3-2") {
		t.Errorf("resolve with a bad range: %d %v", resp.StatusCode, body)
	}
	resp, body = do("POST", "/api/v1/gaps/resolve", "Bearer "+tokAlice, `{"request_id": "r3", "source": "s", "producer": "db-1", "from": 2, "to": 3, "note": "x"}`)
	if resp.StatusCode != 400 || !strings.Contains(body["error"].(string), "producer and topic go together") {
		t.Errorf("resolve with a producer but no topic: %d %v", resp.StatusCode, body)
	}
	resp, body = do("POST", "/api/v1/effects/resolve", "Bearer "+tokAlice, `{"request_id": "r4", "scope": "s", "key": "k"}`)
	if resp.StatusCode != 400 || !strings.Contains(body["error"].(string), "note is required") {
		t.Errorf("resolve an effect without a note: %d %v", resp.StatusCode, body)
	}
	if out := logs.String(); strings.Contains(out, tokAlice) || strings.Contains(out, tokCI) || strings.Contains(out, wrong) {
		t.Errorf("a token reached the log:\n%s", out)
	}
	if !strings.Contains(logs.String(), "request without a valid token refused") {
		t.Errorf("refusals are not logged:\n%s", logs.String())
	}
}

// TestConsolePageServed: the page and its assets come from the binary, with
// a policy that allows only its own script and style.
func TestConsolePageServed(t *testing.T) {
	t.Parallel()
	h, _ := testHandler(t)
	for _, c := range []struct{ path, want, ctype string }{
		{"/", "<title>onceflow console</title>", "text/html"},
		{"/app.js", "sessionStorage", "text/javascript"},
		{"/style.css", ":focus-visible", "text/css"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", c.path, nil))
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), c.want) || !strings.HasPrefix(rec.Header().Get("Content-Type"), c.ctype) {
			t.Errorf("GET %s: %d %q, body has %q: %v", c.path, rec.Code, rec.Header().Get("Content-Type"), c.want, strings.Contains(rec.Body.String(), c.want))
		}
		csp := rec.Header().Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", c.path, csp)
		}
	}
	// No reference to anything outside the binary.
	for _, name := range []string{"index.html", "app.js", "style.css"} {
		b, err := os.ReadFile(filepath.Join("web", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"http://", "https://", "//cdn", "@import"} {
			if strings.Contains(string(b), bad) {
				t.Errorf("web/%s references %q: the console must not load anything from elsewhere", name, bad)
			}
		}
	}
}

// TestConsoleSignInNeverInURL: the sign-in form posts (a submit the script
// does not catch puts the token in a body, not in the URL or the history),
// and the server answers such a POST, unread, with a redirect to the page
// that repeats nothing of it.
func TestConsoleSignInNeverInURL(t *testing.T) {
	t.Parallel()
	h, _ := testHandler(t)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if !strings.Contains(rec.Body.String(), `<form id="login-form" method="post"`) {
		t.Errorf("the sign-in form is not a POST form:\n%s", rec.Body.String())
	}
	const token = "tok-in-a-body-5521"
	req := httptest.NewRequest("POST", "/", strings.NewReader("token="+token+"&actor=dana"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "./" || strings.Contains(rec.Body.String()+fmt.Sprint(rec.Header()), token) {
		t.Errorf("POST /: %d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
}
