package itest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
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
// in a failing `dlq replay`, nor in the exit-2 line of a bad configuration.
func TestConsumerHTTPSecretsNeverShown(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	const pass, apiKey = "pw-9f3e1c", "ak-77d2b04"
	secrets := []string{pass, apiKey}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "upstream down for %s (key %s)", r.URL.String(), r.URL.Query().Get("api_key"))
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	handlers := writeFile(t, "handlers.json", fmt.Sprintf(`{"handlers": [
	  {"event_type": "charge.echo", "kind": "http", "http": {"url": "http://svc:%[1]s@%[2]s/v1/charges?api_key=%[3]s"}},
	  {"event_type": "charge.refused", "kind": "http", "http": {"url": "http://svc:%[1]s@127.0.0.1:1/v1/charges?api_key=%[3]s", "timeout": "1s"}}]}`,
		pass, host, apiKey))
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
		envelope.Envelope{EventID: "refused-1", Source: "acct-r", Seq: 1, EventType: "charge.refused", Payload: []byte(`{}`)})
	p := testkit.Start(t, "consumer", bin, env, "run")
	eventually(t, 60*time.Second, "both events dead-lettered", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'dead'`)
		return n == 2, fmtState(n, " dead")
	})
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
	logs := p.Output()
	clean("the consumer's logs", logs)
	if !strings.Contains(logs, "http 500") || !strings.Contains(logs, "http POST http://127.0.0.1:1") {
		t.Fatalf("the logs do not show the two failures:\n%s", trunc(logs))
	}

	var lastErrors string
	if err := db.Pool.QueryRow(context.Background(), `SELECT string_agg(last_error, ' | ' ORDER BY event_id) FROM onceflow.inbox`).Scan(&lastErrors); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErrors, "upstream down") || !strings.Contains(lastErrors, "[redacted]") {
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
	if !strings.Contains(list, "echo-1") || !strings.Contains(list, "refused-1") {
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
