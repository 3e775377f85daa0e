package handlerfile

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/inbox"
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
// start of a textual response body in the error: the engine has no notion
// of a permanent error, so a 4xx is retried to the limit and then
// dead-lettered with that response as the reason. Nothing is recorded for a
// failed call, so a replay from the dead-letter queue sends again with the
// same key. Redirects are not followed (a 3xx fails like a 4xx).
//
// The URL may carry credentials (user:pass@, ?api_key=, a token in the
// path) and the headers tokens: no error, log line or stored reason ever
// shows more of the URL than its scheme and host, and every configured
// secret (userinfo and the Basic credentials made of it, the path, the query
// and each query value, every header value and the token after its scheme
// word) is blanked out of the error text, response excerpts included — as
// sent, URL-escaped or JSON-escaped, so that a downstream echoing the
// request back shows none of it. The body is blanked before it is cut to
// its excerpt, so a secret across the cut leaks no part of itself.
type HTTPSpec struct {
	Method  string            `json:"method,omitempty"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers,omitempty"`
	// Timeout of one request, a Go duration ("5s"); default 10s.
	Timeout string `json:"timeout,omitempty"`
	// IdempotencyWindow is how long the downstream dedups an
	// Idempotency-Key (a Go duration: Stripe "24h"); default none. A retry
	// of an event whose effect was first claimed longer ago than that is
	// not sent: the effect is held for an operator (effects.StatusHeld,
	// `consumer effects held`) and the event fails until the operator
	// resolves it (the recorded result is then used) or lets it send.
	IdempotencyWindow string `json:"idempotency_window,omitempty"`
}

// maxResponseBody is how much of a response body is read (and hashed).
const maxResponseBody = 1 << 20

// maxExcerpt is how much of a failed call's textual response body is kept in
// the error (and so in inbox.last_error).
const maxExcerpt = 200

// redacted replaces a configured secret in error text.
const redacted = "[redacted]"

type httpHandler struct {
	// entry is the handlers-file entry's event_type: with the consumer name
	// it makes the effects scope.
	entry  string
	method string
	url    string
	// where is the URL as errors show it: scheme and host only.
	where   string
	secrets []string
	headers http.Header
	client  *http.Client
	// afterCall is the OnAfterHTTPCall hook (nil: none).
	afterCall func()
	// window is the downstream's idempotency window (0: none).
	window time.Duration

	mu   sync.Mutex
	pool *pgxpool.Pool
	// claimers send the claims of the calls made before the inbox
	// transaction in groups, one per consumer pool (groupClaimer).
	claimers map[*pgxpool.Pool]*effects.Claimer
	// owner owns the claims made outside the engine (claimOwner).
	owner string
}

func compileHTTP(entry string, s *HTTPSpec) (*httpHandler, error) {
	if s == nil {
		return nil, fmt.Errorf("kind http needs an \"http\" object")
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("http.url %s: want an absolute http or https URL", describeURL(s.URL))
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
	var secrets []string
	for k, v := range s.Headers {
		if strings.EqualFold(k, "Idempotency-Key") {
			return nil, fmt.Errorf("http.headers: Idempotency-Key is set by the handler")
		}
		h.Set(k, v)
		secrets = append(secrets, v)
		if _, tok, ok := strings.Cut(v, " "); ok { // "Bearer <token>"
			secrets = append(secrets, strings.TrimSpace(tok))
		}
	}
	var window time.Duration
	if s.IdempotencyWindow != "" {
		window, err = time.ParseDuration(s.IdempotencyWindow)
		if err != nil || window <= 0 {
			return nil, fmt.Errorf("http.idempotency_window %q: want a positive duration such as \"24h\"", s.IdempotencyWindow)
		}
	}
	secrets = append(secrets, urlSecrets(u)...)
	client := &http.Client{
		Timeout: timeout,
		// A redirect is answered as the response it is: following it could
		// carry the key and the credentials to another host.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &httpHandler{entry: entry, method: method, url: s.URL, where: u.Scheme + "://" + u.Host,
		secrets: secrets, headers: h, client: client, window: window}, nil
}

// describeURL is how a configured URL appears in a configuration error:
// scheme and host when it parses, never userinfo, path or query.
func describeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(not an absolute URL)"
	}
	return fmt.Sprintf("%q", u.Scheme+"://"+u.Host)
}

// urlSecrets are the parts of a URL that may be credentials: userinfo (and
// the Authorization: Basic value net/http makes of it), the path (webhook
// URLs carry their token there), the raw query and each query value.
func urlSecrets(u *url.URL) []string {
	var out []string
	if u.User != nil {
		out = append(out, u.User.String(), u.User.Username())
		p, ok := u.User.Password()
		if ok {
			out = append(out, p)
		}
		basic := base64.StdEncoding.EncodeToString([]byte(u.User.Username() + ":" + p))
		out = append(out, "Basic "+basic, basic)
	}
	if p := u.EscapedPath(); len(p) > 1 {
		out = append(out, p, u.Path)
	}
	if u.RawQuery != "" {
		out = append(out, u.RawQuery)
		for _, vs := range u.Query() {
			out = append(out, vs...)
		}
	}
	if u.Fragment != "" {
		out = append(out, u.Fragment)
	}
	return out
}

// scrub blanks every configured secret out of s (longest first, so that a
// secret containing another is blanked whole), as it was configured and in
// the forms an echo may show it in: URL-escaped (query or path) and
// JSON-escaped. Secrets shorter than 3 bytes are left: blanking them would
// garble the text and hide nothing.
func (h *httpHandler) scrub(s string) string {
	var forms []string
	for _, sec := range h.secrets {
		if len(sec) < 3 {
			continue
		}
		forms = append(forms, sec, url.QueryEscape(sec), url.PathEscape(sec))
		if j, err := json.Marshal(sec); err == nil {
			forms = append(forms, string(j[1:len(j)-1]))
		}
	}
	sort.SliceStable(forms, func(i, j int) bool { return len(forms[i]) > len(forms[j]) })
	for _, f := range forms {
		s = strings.ReplaceAll(s, f, redacted)
	}
	return s
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
	// Body is an excerpt of a textual body, or what the body was.
	Body string
}

func (e *httpStatusError) Error() string {
	kind := "server error, retried"
	if e.Code < 500 {
		kind = "client error, dead-lettered after the retry limit"
	}
	return fmt.Sprintf("http %d (%s): %s", e.Code, kind, e.Body)
}

// httpCallError is a call that got no response. Its text shows the URL as
// scheme and host only, never the *url.Error (which repeats the whole URL).
type httpCallError struct {
	Method, Where string
	Err           error
}

func (e *httpCallError) Error() string {
	return fmt.Sprintf("http %s %s: %v", e.Method, e.Where, e.Err)
}
func (e *httpCallError) Unwrap() error { return e.Err }

// textual reports whether a response content type is text worth quoting.
func textual(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	switch {
	case strings.HasPrefix(mt, "text/"), mt == "application/json", mt == "application/xml",
		strings.HasSuffix(mt, "+json"), strings.HasSuffix(mt, "+xml"):
		return true
	}
	return false
}

// excerpt is what a failed call's error says about its body: the start of a
// textual body (at most maxExcerpt bytes, one line, secrets blanked in the
// whole body first, so that a secret across the cut leaves no prefix), or
// its size and type.
func (h *httpHandler) excerpt(contentType string, body []byte) string {
	if len(body) == 0 {
		return "(empty body)"
	}
	if !textual(contentType) {
		ct := contentType
		if ct == "" {
			ct = "no content type"
		}
		return fmt.Sprintf("(%d bytes of %s, not kept)", len(body), oneLineText(h.scrub(ct), 80))
	}
	return oneLineText(h.scrub(string(body)), maxExcerpt)
}

// oneLineText is s as valid UTF-8 on one line, cut to at most limit bytes
// (plus an ellipsis).
func oneLineText(s string, limit int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// leaseMargin is how much longer an effect's claim lasts than the call's
// timeout: the claim's lease starts on the database's clock just before the
// call, and the call is cancelled when the lease ends (see fencedCall).
const leaseMargin = 5 * time.Second

// lease is how long a claim of this handler's effect lasts.
func (h *httpHandler) lease() time.Duration { return h.client.Timeout + leaseMargin }

// claimOwner is the owner of this handler's claims under ctx: the
// consumer's (inbox.EffectOwner), or, outside the engine (a replay), one of
// this handler's own.
func (h *httpHandler) claimOwner(ctx context.Context) string {
	if o := inbox.EffectOwner(ctx); o != "" {
		return o
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.owner == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		h.owner = "handler/" + hex.EncodeToString(b[:])
	}
	return h.owner
}

// fenced is one event's effect: its ledger identity and the call's result
// (Replayed when the ledger had it and nothing was sent).
type fenced struct {
	scope, key, owner, eventID string
	res                        effects.Result
}

// Abandon drops the claim of an effect whose inbox transaction will not run
// here (inbox.Prepared): the next owner of the partition claims it at once.
func (f *fenced) Abandon(ctx context.Context, db *pgxpool.Pool) error {
	if f.res.Replayed {
		return nil
	}
	_, err := effects.ReleaseLease(ctx, db, f.scope, f.key, f.owner)
	return err
}

// fencedCall claims the event's effect in the ledger (a short statement on
// db that commits on its own: effects.ClaimLease, waiting while another
// live consumer holds it), then, unless its result is recorded, sends the
// request with the key, holding no connection, cancelled when the claim's
// lease ends. The result is not recorded here: the caller records it in the
// inbox transaction (record). A failed call gives the claim up; the intent
// stays and the next try sends the same key.
//
// With cl, the claim goes in cl's next group (effects.Claimer) rather than
// in a statement of its own: the many calls a consumer starts at once
// share their claims' statements.
func (h *httpHandler) fencedCall(ctx context.Context, db effects.Querier, cl *effects.Claimer, ev *inbox.Event) (f *fenced, err error) {
	ctx, span := startHandler(ctx, ev, "http", httpSpanAttrs(h.method, h.url)...)
	sent, code := false, 0
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(attrReplayed.Bool(!sent && err == nil))
			if code != 0 {
				span.SetAttributes(semconv.HTTPResponseStatusCode(code))
			}
		}
		if err != nil {
			// The call's own errors are clean; this also covers anything a
			// lower layer may have repeated.
			err = &scrubbedError{msg: h.scrub(err.Error()), err: err}
		}
		endHandler(span, err, httpErrorText(err))
	}()
	key, err := effects.EventKey(ev.EventID)
	if err != nil {
		return nil, err
	}
	if span.IsRecording() {
		span.SetAttributes(attrIdemKey.String(key))
	}
	f = &fenced{scope: effects.ConsumerScope(inbox.ConsumerName(ctx), "http", h.entry), key: key, owner: h.claimOwner(ctx), eventID: ev.EventID}
	lease := h.lease()
	start := time.Now() // before the claim: the call ends before the database's lease does
	var c effects.Claim
	if cl != nil {
		c, err = cl.ClaimWait(ctx, f.scope, f.key, ev.EventID, f.owner, lease)
	} else {
		c, err = effects.ClaimWait(ctx, db, f.scope, f.key, ev.EventID, f.owner, lease)
	}
	if err != nil {
		return nil, err
	}
	if c.Status == effects.StatusDone {
		f.res = c.Result
		code = c.Result.Code
		return f, nil
	}
	if h.window > 0 {
		// A retry past the downstream's window holds the effect (and drops
		// the claim with it); there is no reconcile hook for this handler.
		if _, err := effects.Settle(ctx, db, f.scope, f.key, c.Attempts, effects.Options{Window: h.window}); err != nil {
			if !errors.Is(err, effects.ErrHeld) {
				if _, rerr := effects.ReleaseLease(context.WithoutCancel(ctx), db, f.scope, f.key, f.owner); rerr != nil {
					err = fmt.Errorf("%w (and release the claim: %v)", err, rerr)
				}
			}
			return nil, err
		}
	}
	cctx, cancel := context.WithDeadline(ctx, start.Add(lease))
	sent = true
	res, err := h.send(cctx, key, ev)
	cancel()
	var se *httpStatusError
	if errors.As(err, &se) {
		code = se.Code
	}
	if h.afterCall != nil {
		h.afterCall()
	}
	if err != nil {
		if _, rerr := effects.ReleaseLease(context.WithoutCancel(ctx), db, f.scope, f.key, f.owner); rerr != nil {
			err = fmt.Errorf("%w (and release the claim: %v)", err, rerr)
		}
		return nil, fmt.Errorf("effects: call %q: %w", key, err)
	}
	code = res.Code
	f.res = res
	return f, nil
}

// record writes a call's result in the inbox transaction (status done),
// unless the ledger had it already.
func (f *fenced) record(ctx context.Context, tx pgx.Tx) error {
	if f.res.Replayed {
		return nil
	}
	if _, err := effects.RecordLeaseOf(ctx, tx, f.scope, f.key, f.eventID, f.res); err != nil {
		return err
	}
	return nil
}

// prepared is the effect made for ev before its transaction (nil when none
// was), or the error making it failed with.
func prepared(ev *inbox.Event) (*fenced, error) {
	p := ev.Prepared()
	if p == nil {
		return nil, nil
	}
	if p.Err != nil {
		return nil, p.Err
	}
	f, _ := p.Value.(*fenced)
	return f, nil
}

// effect is the handler's inbox.Effecter side: the call is made before the
// inbox transaction, claimed through db (the consumer's pool), and recorded
// by handle in the transaction.
func (h *httpHandler) effect(ctx context.Context, db *pgxpool.Pool, ev inbox.Event) (inbox.Prepared, error) {
	f, err := h.fencedCall(ctx, db, h.groupClaimer(db), &ev)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// maxClaimGroup bounds the claims of one group statement.
const maxClaimGroup = 256

// groupClaimer is the Claimer of the calls made before the transactions of
// the consumer whose pool is db.
func (h *httpHandler) groupClaimer(db *pgxpool.Pool) *effects.Claimer {
	h.mu.Lock()
	defer h.mu.Unlock()
	cl := h.claimers[db]
	if cl == nil {
		if h.claimers == nil {
			h.claimers = map[*pgxpool.Pool]*effects.Claimer{}
		}
		cl = effects.NewClaimer(db, maxClaimGroup)
		h.claimers[db] = cl
	}
	return cl
}

// handle records the effect made before the transaction, or, for an event
// that had none (a released parked event, a late one, a replay), makes it
// now: claim on the ledger pool, call, record in tx.
func (h *httpHandler) handle(ctx context.Context, tx pgx.Tx, ev *inbox.Event) error {
	if f, err := prepared(ev); err != nil {
		return err
	} else if f != nil {
		return f.record(ctx, tx)
	}
	pool, err := h.ledgerPool(ctx, tx)
	if err != nil {
		return err
	}
	f, err := h.fencedCall(ctx, pool, nil, ev)
	if err != nil {
		return err
	}
	return f.record(ctx, tx)
}

// scrubbedError is err with secrets blanked out of its text; errors.Is and
// errors.As still see err (a database error stays infrastructure trouble).
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

func (h *httpHandler) send(ctx context.Context, key string, ev *inbox.Event) (effects.Result, error) {
	req, err := http.NewRequestWithContext(ctx, h.method, h.url, bytes.NewReader(ev.Payload))
	if err != nil {
		return effects.Result{}, &httpCallError{Method: h.method, Where: h.where, Err: errors.New("bad request")}
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
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // *url.Error repeats the whole URL
		}
		return effects.Result{}, &httpCallError{Method: h.method, Where: h.where, Err: errors.New(h.scrub(err.Error()))}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody))
	if err != nil {
		return effects.Result{}, &httpCallError{Method: h.method, Where: h.where, Err: errors.New("read response: " + h.scrub(err.Error()))}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return effects.Result{}, &httpStatusError{Code: resp.StatusCode, Body: h.excerpt(resp.Header.Get("Content-Type"), body)}
	}
	sum := sha256.Sum256(body)
	summary, _ := json.Marshal(map[string]any{"status": resp.StatusCode, "bytes": len(body), "sha256": hex.EncodeToString(sum[:])})
	return effects.Result{Code: resp.StatusCode, Summary: summary}, nil
}

// PlannedEffects returns what a handler made by Load, Parse or Compile
// would call for an event (for a replay's dry run, effects.PreviewEvent):
// the http entry of the event's type, in the consumer's scope for it, with
// the event's key and the entry's idempotency window. Events of other kinds
// make none. It returns nil for a handler that is not a handler file's.
func PlannedEffects(h inbox.BatchHandler) func(consumer, eventType, eventID string) []effects.Planned {
	var c *configured
	switch v := h.(type) {
	case *configured:
		c = v
	case *effecting:
		c = v.configured
	default:
		return nil
	}
	return func(consumer, eventType, eventID string) []effects.Planned {
		e := c.lookup(eventType)
		if e == nil || e.http == nil {
			return nil
		}
		key, err := effects.EventKey(eventID)
		if err != nil {
			return nil
		}
		return []effects.Planned{{Scope: effects.ConsumerScope(consumer, "http", e.http.entry), Key: key, Window: e.http.window}}
	}
}
