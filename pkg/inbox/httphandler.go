package inbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/onceflow/onceflow/pkg/effects"
)

// HTTPSpec configures a handler of kind "http": the event's payload is sent
// to URL with the header Idempotency-Key: event:<event id>, fenced by the
// effects ledger (see pkg/effects):
//
//	{"event_type": "order.placed", "kind": "http",
//	 "http": {"method": "POST", "url": "https://api.example.com/orders",
//	          "headers": {"Authorization": "Bearer …"}, "timeout": "5s"}}
//
// A 2xx response is recorded in onceflow.effects (status done, result_code,
// a summary with the body's SHA-256) and a redelivery returns it without
// sending. A 5xx, a timeout or a transport error fails the event: it is
// retried with the consumer's backoff (same key, the downstream dedups) and
// dead-lettered after the limit. A 4xx fails it too, with the status and the
// start of the response body in the error: the engine has no notion of a
// permanent error, so a 4xx is retried to the limit and then dead-lettered
// with that response as the reason. Nothing is recorded for a failed call,
// so a replay from the dead-letter queue sends again with the same key.
type HTTPSpec struct {
	Method  string            `json:"method,omitempty"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	// Timeout of one request, a Go duration ("5s"); default 10s.
	Timeout string `json:"timeout,omitempty"`
}

// maxResponseBody is how much of a response body is read (and hashed).
const maxResponseBody = 1 << 20

type httpHandler struct {
	method  string
	url     string
	headers http.Header
	client  *http.Client

	mu   sync.Mutex
	pool *pgxpool.Pool
}

func compileHTTP(s *HTTPSpec) (*httpHandler, error) {
	if s == nil {
		return nil, fmt.Errorf("kind http needs an \"http\" object")
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("http.url %q: want an absolute http or https URL", s.URL)
	}
	method := strings.ToUpper(s.Method)
	if method == "" {
		method = http.MethodPost
	}
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return nil, fmt.Errorf("http.method %q: want POST, PUT, PATCH or DELETE", s.Method)
	}
	timeout := 10 * time.Second
	if s.Timeout != "" {
		timeout, err = time.ParseDuration(s.Timeout)
		if err != nil || timeout <= 0 {
			return nil, fmt.Errorf("http.timeout %q: want a positive duration such as \"5s\"", s.Timeout)
		}
	}
	h := http.Header{}
	for k, v := range s.Headers {
		if strings.EqualFold(k, "Idempotency-Key") {
			return nil, fmt.Errorf("http.headers: Idempotency-Key is set by the handler")
		}
		h.Set(k, v)
	}
	return &httpHandler{method: method, url: s.URL, headers: h, client: &http.Client{Timeout: timeout}}, nil
}

// ledgerPool is the pool the ledger is written through: a separate one on
// the inbox's database (the configuration of tx's connection), because the
// intent must commit before the call whatever becomes of the inbox
// transaction. It lives as long as the process.
func (h *httpHandler) ledgerPool(ctx context.Context, tx pgx.Tx) (*pgxpool.Pool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pool != nil {
		return h.pool, nil
	}
	pc, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	pc.ConnConfig = tx.Conn().Config()
	pc.MaxConns = 4
	p, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("effects ledger pool: %w", err)
	}
	h.pool = p
	return p, nil
}

// httpStatusError is a non-2xx response.
type httpStatusError struct {
	Code int
	Body string
}

func (e *httpStatusError) Error() string {
	kind := "server error, retried"
	if e.Code >= 400 && e.Code < 500 {
		kind = "client error, dead-lettered after the retry limit"
	}
	return fmt.Sprintf("http %d (%s): %s", e.Code, kind, e.Body)
}

func (h *httpHandler) handle(ctx context.Context, tx pgx.Tx, ev *Event) (err error) {
	ctx, span := startHandler(ctx, ev, "http", httpSpanAttrs(h.method, h.url)...)
	sent, code := false, 0
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(attrReplayed.Bool(!sent && err == nil))
			if code != 0 {
				span.SetAttributes(semconv.HTTPResponseStatusCode(code))
			}
		}
		endHandler(span, err, httpErrorText(err))
	}()
	key, err := effects.EventKey(ev.EventID)
	if err != nil {
		return err
	}
	if span.IsRecording() {
		span.SetAttributes(attrIdemKey.String(key))
	}
	pool, err := h.ledgerPool(ctx, tx)
	if err != nil {
		return err
	}
	res, err := effects.Do(effects.WithEventID(ctx, ev.EventID), pool, key, func(ctx context.Context, key string) (effects.Result, error) {
		sent = true
		r, err := h.send(ctx, key, ev)
		var se *httpStatusError
		if errors.As(err, &se) {
			code = se.Code
		}
		return r, err
	})
	if err == nil {
		code = res.Code
	}
	return err
}

func (h *httpHandler) send(ctx context.Context, key string, ev *Event) (effects.Result, error) {
	req, err := http.NewRequestWithContext(ctx, h.method, h.url, bytes.NewReader(ev.Payload))
	if err != nil {
		return effects.Result{}, err
	}
	req.Header = h.headers.Clone()
	if req.Header.Get("Content-Type") == "" {
		ct := ev.ContentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	req.Header.Set("Idempotency-Key", key)
	injectTraceparent(ctx, req.Header)
	req.Header.Set("X-Onceflow-Event-Id", ev.EventID)
	req.Header.Set("X-Onceflow-Event-Type", ev.EventType)
	if ev.Source != "" {
		req.Header.Set("X-Onceflow-Source", ev.Source)
		req.Header.Set("X-Onceflow-Seq", strconv.FormatInt(ev.Seq, 10))
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return effects.Result{}, fmt.Errorf("http %s %s: %w", h.method, h.url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if err != nil {
		return effects.Result{}, fmt.Errorf("http %s %s: read response: %w", h.method, h.url, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		excerpt := string(body)
		if len(excerpt) > 500 {
			excerpt = excerpt[:500] + "…"
		}
		return effects.Result{}, &httpStatusError{Code: resp.StatusCode, Body: excerpt}
	}
	sum := sha256.Sum256(body)
	summary, _ := json.Marshal(map[string]any{"status": resp.StatusCode, "bytes": len(body), "sha256": hex.EncodeToString(sum[:])})
	return effects.Result{Code: resp.StatusCode, Summary: summary}, nil
}
