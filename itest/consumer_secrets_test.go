package itest

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// TestConsumerHTTPSecretsNeverShown: the http handler's URLs carry
// user:pass@ and ?api_key=, one pointing at a server that answers 500 and
// echoes the request URL in its body, one at a closed port. Both events are
// retried and dead-lettered; then neither secret appears in the consumer's
// logs, in any onceflow table (inbox.last_error included), in `dlq list`,
// in a failing `dlq replay`, in the console's API, nor in the exit-2 line of
// a bad configuration. A third URL points at a server that echoes the whole
// request in a 400 body, its Authorization: Basic value (made by net/http
// of the URL's userinfo) placed across the 200-byte cut of the excerpt, and
// then the configured X-Api-Key header and the URL with its webhook token
// in the path: no part of any of them is shown.
func TestConsumerHTTPSecretsNeverShown(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	const pass, apiKey, hdrKey, pathTok = "pw-9f3e1c", "ak-77d2b04", "hk-5a1c93e0", "T0K3N-in-the-path-61b2"
	basic := base64.StdEncoding.EncodeToString([]byte("svc:" + pass))
	secrets := []string{pass, apiKey, hdrKey, pathTok, basic, basic[:8]}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if strings.HasPrefix(r.URL.Path, "/hooks/") {
			auth := r.Header.Get("Authorization")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, "%s%s; x-api-key %s; url %s", strings.Repeat(".", 204-len(auth)), auth, r.Header.Get("X-Api-Key"), r.URL.String())
			return
		}
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "upstream down for %s (key %s)", r.URL.String(), r.URL.Query().Get("api_key"))
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	handlers := writeFile(t, "handlers.json", fmt.Sprintf(`{"handlers": [
	  {"event_type": "charge.echo", "kind": "http", "http": {"url": "http://svc:%[1]s@%[2]s/v1/charges?api_key=%[3]s"}},
	  {"event_type": "charge.echo400", "kind": "http", "http": {"url": "http://svc:%[1]s@%[2]s/hooks/%[5]s?api_key=%[3]s",
	   "headers": {"X-Api-Key": "%[4]s"}}},
	  {"event_type": "charge.refused", "kind": "http", "http": {"url": "http://svc:%[1]s@127.0.0.1:1/v1/charges?api_key=%[3]s", "timeout": "1s"}}]}`,
		pass, host, apiKey, hdrKey, pathTok))
	const adminToken = "secrets-test-admin-token-3f9a"
	tokenFile := filepath.Join(t.TempDir(), "admin-tokens")
	if err := os.WriteFile(tokenFile, []byte("oncall "+adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	topic := testkit.Topic(t, "secrets", 1, nil)
	bin := testkit.Binary(t, "consumer")
	env := []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + topic,
		"ONCEFLOW_TOPICS=" + topic,
		"ONCEFLOW_HANDLERS_FILE=" + handlers,
		"ONCEFLOW_HTTP_ADDR=",
		"ONCEFLOW_LOG_LEVEL=debug",
		"ONCEFLOW_RETRY_MAX_ATTEMPTS=2",
		"ONCEFLOW_RETRY_INITIAL_INTERVAL=10ms",
		"ONCEFLOW_RETRY_MAX_INTERVAL=20ms",
		"ONCEFLOW_FAILPOINTS=",
	}
	produce(t, testkit.Client(t), topic,
		envelope.Envelope{EventID: "echo-1", Source: "acct-e", Seq: 1, EventType: "charge.echo", Payload: []byte(`{}`)},
		envelope.Envelope{EventID: "echo400-1", Source: "acct-4", Seq: 1, EventType: "charge.echo400", Payload: []byte(`{}`)},
		envelope.Envelope{EventID: "refused-1", Source: "acct-r", Seq: 1, EventType: "charge.refused", Payload: []byte(`{}`)})
	p := testkit.Start(t, "consumer", bin, append(append([]string{}, env...),
		"ONCEFLOW_ADMIN=true", "ONCEFLOW_ADMIN_ADDR=127.0.0.1:0", "ONCEFLOW_ADMIN_TOKEN_FILE="+tokenFile), "run")
	wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	line, err := p.WaitFor(wctx, adminListening)
	if err != nil {
		t.Fatalf("admin server: %v\n%s", err, p.Output())
	}
	eventually(t, 60*time.Second, "the three events dead-lettered", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'dead'`)
		return n == 3, fmtState(n, " dead")
	})
	api := apiClient{t: t, base: "http://" + adminListening.FindStringSubmatch(line)[1], token: adminToken}
	var consoleJSON strings.Builder
	for _, path := range []string{"/api/v1/dead-letters", "/api/v1/dead-letters/groups"} {
		a := api.call("GET", path, nil)
		if a.code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, a.code, a.body)
		}
		consoleJSON.Write(a.body)
	}
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(60 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	clean := func(what, text string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s shows the secret %q:\n%s", what, s, trunc(text))
			}
		}
	}
	clean("the console's API", consoleJSON.String())
	if !strings.Contains(consoleJSON.String(), "echo400-1") || !strings.Contains(consoleJSON.String(), "http 400") {
		t.Fatalf("the console's dead letters do not show the 400:\n%s", trunc(consoleJSON.String()))
	}
	logs := p.Output()
	clean("the consumer's logs", logs)
	if !strings.Contains(logs, "http 500") || !strings.Contains(logs, "http POST http://127.0.0.1:1") {
		t.Fatalf("the logs do not show the two failures:\n%s", trunc(logs))
	}

	var lastErrors string
	if err := db.Pool.QueryRow(context.Background(), `SELECT string_agg(last_error, ' | ' ORDER BY event_id) FROM onceflow.inbox`).Scan(&lastErrors); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErrors, "upstream down") || !strings.Contains(lastErrors, "http 400") || !strings.Contains(lastErrors, "[redacted]") {
		t.Fatalf("inbox.last_error %q: want the (scrubbed) response excerpt", lastErrors)
	}
	for _, table := range []string{"inbox", "effects", "consumer_offsets", "seq_state", "seq_gaps"} {
		var dump string
		if err := db.Pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT coalesce(string_agg(row_to_json(t)::text, E'\n'), '') FROM onceflow.%s t`, table)).Scan(&dump); err != nil {
			t.Fatal(err)
		}
		clean("onceflow."+table, dump)
	}
	list := runBin(t, bin, env, "dlq", "list")
	if !strings.Contains(list, "echo-1") || !strings.Contains(list, "echo400-1") || !strings.Contains(list, "refused-1") {
		t.Fatalf("dlq list:\n%s", list)
	}
	clean("dlq list", list)
	out, err := runBinErr(bin, env, "dlq", "replay", "echo-1")
	if err == nil || !strings.Contains(out, "http 500") {
		t.Fatalf("dlq replay of a still-failing event: %v\n%s", err, out)
	}
	clean("dlq replay", out)

	bad := writeFile(t, "bad.json", fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "http", "http": {"url": "ftp://svc:%s@h/x?api_key=%s"}}]}`, pass, apiKey))
	out, err = runBinErr(bin, append(append([]string{}, env...), "ONCEFLOW_HANDLERS_FILE="+bad), "run")
	if err == nil || !strings.Contains(out, "want an absolute http or https URL") {
		t.Fatalf("bad URL: %v\n%s", err, out)
	}
	clean("the configuration error", out)
}
