package handlerfile

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// TestHTTPHandlerRedacts: whatever fails — no connection, a 4xx whose body
// echoes the request, a binary body, a redirect, a bad configuration — the
// error text shows the URL as scheme and host only and none of the
// configured secrets; a binary body is not quoted; a textual one is cut.
func TestHTTPHandlerRedacts(t *testing.T) {
	t.Parallel()
	const pass, key, token = "pa55word-x", "K3Y-value-9", "T0KEN-abc-123"
	secrets := []string{pass, key, token, "alice:"}
	clean := func(t *testing.T, what, s string) {
		t.Helper()
		for _, sec := range secrets {
			if strings.Contains(s, sec) {
				t.Errorf("%s leaks %q: %s", what, sec, s)
			}
		}
		if what != "echo" && strings.Contains(s, "/hook") { // the echo is the server's own text
			t.Errorf("%s shows the URL path: %s", what, s)
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Onceflow-Event-Id") {
		case "echo":
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte("bad request to " + r.URL.String() + " auth " + r.Header.Get("Authorization") + strings.Repeat(" padding", 100)))
		case "binary":
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte("\x00\x01" + key))
		case "redirect":
			http.Redirect(w, r, "http://example.invalid/?api_key="+key, http.StatusFound)
		}
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	compile := func(t *testing.T, u string) *httpHandler {
		t.Helper()
		h, err := compileHTTP("*", &HTTPSpec{URL: u, Headers: map[string]string{"Authorization": "Bearer " + token}})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := compile(t, "http://alice:"+pass+"@"+host+"/hook?api_key="+key)
	for _, id := range []string{"echo", "binary", "redirect"} {
		_, err := h.send(context.Background(), "event:"+id, &inbox.Event{Envelope: envelope.Envelope{EventID: id, Payload: []byte(`{}`)}})
		if err == nil {
			t.Fatalf("%s: no error", id)
		}
		clean(t, id, err.Error())
		switch id {
		case "echo":
			if !strings.Contains(err.Error(), "http 400") || !strings.Contains(err.Error(), redacted) || len(err.Error()) > maxExcerpt+120 {
				t.Errorf("echo: %s", err)
			}
		case "binary":
			if !strings.Contains(err.Error(), "bytes of application/octet-stream, not kept") {
				t.Errorf("binary: %s", err)
			}
		case "redirect":
			if !strings.Contains(err.Error(), "http 302") {
				t.Errorf("redirect was followed or misreported: %s", err)
			}
		}
	}
	refused := compile(t, "http://alice:"+pass+"@127.0.0.1:1/hook?api_key="+key)
	_, err := refused.send(context.Background(), "event:x", &inbox.Event{Envelope: envelope.Envelope{EventID: "x"}})
	if err == nil || !strings.Contains(err.Error(), "http POST http://127.0.0.1:1") {
		t.Fatalf("connection refused: %v", err)
	}
	clean(t, "connection refused", err.Error())
	_, err = compileHTTP("*", &HTTPSpec{URL: "ftp://alice:" + pass + "@h/hook?api_key=" + key})
	if err == nil {
		t.Fatal("ftp URL accepted")
	}
	clean(t, "config error", err.Error())
}

// TestHTTPHandlerRedactsEchoes: a downstream that echoes the request back
// in a 4xx body — the Authorization: Basic value net/http makes of the
// URL's userinfo, every configured header, the path and the query, as sent
// or JSON-escaped — shows none of it in the error, and a secret that
// straddles the excerpt's cut leaves no prefix of itself either.
func TestHTTPHandlerRedactsEchoes(t *testing.T) {
	t.Parallel()
	const (
		pass    = "pa55word-x"
		key     = "K3Y-value-9"
		apiHdr  = "hdr-secret-<&>-42"
		pathTok = "T00000/B00000/XXXXsecretXXXX"
	)
	basic := base64.StdEncoding.EncodeToString([]byte("alice:" + pass))
	secrets := []string{pass, key, apiHdr, pathTok, basic, "secretXXXX", basic[:8]}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Onceflow-Event-Id") {
		case "json":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			_ = json.NewEncoder(w).Encode(map[string]any{"api_key": r.Header.Get("X-Api-Key"), "auth": r.Header.Get("Authorization"), "url": r.URL.String()})
		default:
			// The Basic value placed so that it straddles the cut at
			// maxExcerpt bytes.
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusBadRequest)
			auth := r.Header.Get("Authorization")
			_, _ = w.Write([]byte(strings.Repeat("x", maxExcerpt-len(auth)/2) + auth + " and more"))
		}
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	h, err := compileHTTP("*", &HTTPSpec{URL: "http://alice:" + pass + "@" + host + "/services/" + pathTok + "?api_key=" + key,
		Headers: map[string]string{"X-Api-Key": apiHdr}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"straddle", "json"} {
		_, err := h.send(context.Background(), "event:"+id, &inbox.Event{Envelope: envelope.Envelope{EventID: id, Payload: []byte(`{}`)}})
		if err == nil {
			t.Fatalf("%s: no error", id)
		}
		msg := err.Error()
		t.Logf("%s: %s", id, msg)
		for _, sec := range secrets {
			if strings.Contains(msg, sec) {
				t.Errorf("%s leaks %q: %s", id, sec, msg)
			}
		}
		if !strings.Contains(msg, redacted) {
			t.Errorf("%s: nothing redacted: %s", id, msg)
		}
	}
}
