package admin

import (
	"context"
	"crypto/tls"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/httpserver"
	"github.com/onceflow/onceflow/pkg/inbox/status"
)

//go:embed web
var webFiles embed.FS

// ActorHeader names the person behind a request, for the audit (default:
// the token's name).
const ActorHeader = "X-Onceflow-Actor"

// RepeatedHeader is set on the answer to a change whose request id was seen
// before: the body is the first request's stored answer.
const RepeatedHeader = "Idempotent-Replayed"

type callerKey struct{}

type serverCtxKey struct{}

// NewHandler returns the consumer's admin handler: the JSON API under
// /api/v1/ (bearer token required) and the console page at / (static files,
// no data; the page asks for the token and sends it with every call).
func NewHandler(svc *Service, tokens *Tokens, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &handler{svc: svc, log: log}
	api := http.NewServeMux()
	api.HandleFunc("GET /api/v1/session", h.session)
	api.HandleFunc("GET /api/v1/summary", h.summary)
	api.HandleFunc("GET /api/v1/gaps", h.gaps)
	api.HandleFunc("POST /api/v1/gaps/resolve", h.resolveGap)
	api.HandleFunc("POST /api/v1/gaps/give-up", h.giveUpGap)
	api.HandleFunc("GET /api/v1/dead-letters", h.deadLetters)
	api.HandleFunc("GET /api/v1/dead-letters/groups", h.groups)
	api.HandleFunc("POST /api/v1/dead-letters/replay", h.replay)
	api.HandleFunc("GET /api/v1/held", h.held)
	api.HandleFunc("GET /api/v1/effects/held", h.heldEffects)
	api.HandleFunc("POST /api/v1/effects/resolve", h.resolveEffect)
	api.HandleFunc("POST /api/v1/effects/unhold", h.unholdEffect)
	api.HandleFunc("GET /api/v1/lag", h.lag)
	api.HandleFunc("GET /api/v1/relay", h.relay)
	api.HandleFunc("GET /api/v1/audit", h.audit)
	api.HandleFunc("GET /api/v1/reconcile", h.lastReconcile)
	api.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	root := http.NewServeMux()
	root.Handle("/api/", apiHeaders(authenticate(tokens, log, api)))
	web, _ := fs.Sub(webFiles, "web")
	root.Handle("/", pageHeaders(http.FileServerFS(web)))
	return root
}

// NewRelayHandler returns the relay's admin handler: GET /api/v1/relay (the
// relay's status, with self's role) and GET /api/v1/session, bearer token
// required.
func NewRelayHandler(pool *pgxpool.Pool, self func() RelaySelf, tokens *Tokens, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	api := http.NewServeMux()
	api.HandleFunc("GET /api/v1/session", func(w http.ResponseWriter, r *http.Request) {
		c := caller(r)
		writeJSON(w, http.StatusOK, map[string]string{"actor": c.Actor, "via": c.Via, "binary": "relay"})
	})
	api.HandleFunc("GET /api/v1/relay", func(w http.ResponseWriter, r *http.Request) {
		st, err := ReadRelayStatus(r.Context(), pool)
		if err != nil {
			writeErr(w, log, r, err)
			return
		}
		if self != nil {
			s := self()
			st.Self = &s
		}
		writeJSON(w, http.StatusOK, st)
	})
	api.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint on the relay: "+r.Method+" "+r.URL.Path+" (the console is served by the consumer)")
	})
	root := http.NewServeMux()
	root.Handle("/api/", apiHeaders(authenticate(tokens, log, api)))
	return root
}

// Serve listens on f.Addr and serves h (over TLS with
// -admin-tls-cert-file) until ctx ends, then shuts down gracefully (a bulk
// replay in flight stops between two events and records what it did). It
// logs "admin listening" with the bound address.
func Serve(ctx context.Context, f Flags, h http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", f.Addr)
	if err != nil {
		return err
	}
	tc := f.tlsConfig()
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	if log != nil {
		log.InfoContext(ctx, "admin listening", slog.String("addr", ln.Addr().String()), slog.Bool("tls", tc != nil))
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(context.WithoutCancel(ctx), serverCtxKey{}, ctx)
		},
	}
	return httpserver.ServeUntil(ctx, srv, ln, 10*time.Second)
}

// authenticate admits requests with a valid bearer token and puts the
// caller in their context. The token itself is never logged.
func authenticate(tokens *Tokens, log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		name, valid := tokens.Check(strings.TrimSpace(tok))
		if !ok || !valid {
			log.WarnContext(r.Context(), "admin: request without a valid token refused",
				slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("remote", r.RemoteAddr))
			w.Header().Set("WWW-Authenticate", `Bearer realm="onceflow-admin"`)
			writeError(w, http.StatusUnauthorized, "a valid bearer token is required (Authorization: Bearer …)")
			return
		}
		actor := CleanActor(r.Header.Get(ActorHeader))
		if actor == "" {
			actor = name
		}
		ctx := context.WithValue(r.Context(), callerKey{}, Caller{Actor: actor, Via: "api:" + name})
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func caller(r *http.Request) Caller {
	c, _ := r.Context().Value(callerKey{}).(Caller)
	return c
}

func apiHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		next.ServeHTTP(w, r)
	})
}

// pageHeaders: the page runs only its own script and style, is never
// framed, and sends no referrer.
//
// The sign-in form is a POST, so that a submit the script does not catch
// (a script error, a programmatic form.submit()) puts the token in a body,
// never in the URL, the history or a proxy's access log; such a POST is
// answered, unread, with a redirect to the page (303: the browser GETs it).
func pageHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			// Relative, so that it holds behind a proxy's path prefix.
			w.Header().Set("Location", "./")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
			"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		next.ServeHTTP(w, r)
	})
}

// workContext is the context of a change: it survives the client going
// away (a replay half done is worse than one finished) and ends when the
// server shuts down.
func workContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	if base, ok := r.Context().Value(serverCtxKey{}).(context.Context); ok {
		stop := context.AfterFunc(base, cancel)
		return ctx, func() { stop(); cancel() }
	}
	return ctx, cancel
}

type handler struct {
	svc *Service
	log *slog.Logger
}

func (h *handler) session(w http.ResponseWriter, r *http.Request) {
	c := caller(r)
	writeJSON(w, http.StatusOK, map[string]any{"actor": c.Actor, "via": c.Via, "binary": "consumer",
		"consumer": h.svc.cfg.Consumer, "group": h.svc.cfg.Group, "topics": h.svc.cfg.Topics})
}

func (h *handler) summary(w http.ResponseWriter, r *http.Request) {
	s, err := h.svc.Summary(r.Context())
	h.reply(w, r, s, err)
}

func (h *handler) gaps(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	since := 24 * time.Hour
	if v := q.Get("since"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, "since "+strconv.Quote(v)+": want a positive duration such as 24h")
			return
		}
		since = d
	}
	gaps, err := h.svc.Gaps(r.Context(), q.Get("all") == "true", since)
	h.reply(w, r, map[string]any{"gaps": gaps}, err)
}

func (h *handler) resolveGap(w http.ResponseWriter, r *http.Request) {
	var req ResolveRequest
	if !decode(w, r, &req) {
		return
	}
	ctx, cancel := workContext(r)
	defer cancel()
	out, err := h.svc.ResolveGap(ctx, caller(r), req)
	h.replyChange(w, r, out, out.ErrorKind, out.Repeated, err)
}

func (h *handler) giveUpGap(w http.ResponseWriter, r *http.Request) {
	var req GiveUpRequest
	if !decode(w, r, &req) {
		return
	}
	ctx, cancel := workContext(r)
	defer cancel()
	out, err := h.svc.GiveUpGap(ctx, caller(r), req)
	h.replyChange(w, r, out, out.ErrorKind, out.Repeated, err)
}

// replyChange answers an audited change: 404 for not_found, 500 for error,
// and the repeated header for a request id seen before.
func (h *handler) replyChange(w http.ResponseWriter, r *http.Request, out any, errorKind string, repeated bool, err error) {
	if err != nil {
		writeErr(w, h.log, r, err)
		return
	}
	code := http.StatusOK
	switch errorKind {
	case "not_found":
		code = http.StatusNotFound
	case "error":
		code = http.StatusInternalServerError
	}
	if repeated {
		w.Header().Set(RepeatedHeader, "true")
	}
	writeJSON(w, code, out)
}

func (h *handler) deadLetters(w http.ResponseWriter, r *http.Request) {
	limit, ok := limitParam(w, r, 100, 1000)
	if !ok {
		return
	}
	rows, err := h.svc.DeadLetters(r.Context(), FilterFromQuery(r.URL.Query()), limit)
	h.reply(w, r, map[string]any{"dead_letters": rows}, err)
}

func (h *handler) held(w http.ResponseWriter, r *http.Request) {
	limit, ok := limitParam(w, r, 100, 1000)
	if !ok {
		return
	}
	p := FilterFromQuery(r.URL.Query())
	p.Status = string(status.Held)
	rows, err := h.svc.DeadLetters(r.Context(), p, limit)
	h.reply(w, r, map[string]any{"held": rows}, err)
}

// heldEffects lists the effects held for an operator (?scope_prefix=,
// ?limit=).
func (h *handler) heldEffects(w http.ResponseWriter, r *http.Request) {
	limit, ok := limitParam(w, r, 100, 1000)
	if !ok {
		return
	}
	rows, err := h.svc.HeldEffects(r.Context(), r.URL.Query().Get("scope_prefix"), limit)
	h.reply(w, r, map[string]any{"effects": rows}, err)
}

func (h *handler) resolveEffect(w http.ResponseWriter, r *http.Request) {
	h.effectChange(w, r, h.svc.ResolveEffect)
}

func (h *handler) unholdEffect(w http.ResponseWriter, r *http.Request) {
	h.effectChange(w, r, h.svc.UnholdEffect)
}

// effectChange answers a resolve or unhold: 409 when the effect is not held.
func (h *handler) effectChange(w http.ResponseWriter, r *http.Request, do func(context.Context, Caller, EffectRequest) (EffectOutcome, error)) {
	var req EffectRequest
	if !decode(w, r, &req) {
		return
	}
	ctx, cancel := workContext(r)
	defer cancel()
	out, err := do(ctx, caller(r), req)
	if err == nil && out.ErrorKind == "not_held" {
		if out.Repeated {
			w.Header().Set(RepeatedHeader, "true")
		}
		writeJSON(w, http.StatusConflict, out)
		return
	}
	h.replyChange(w, r, out, out.ErrorKind, out.Repeated, err)
}

func (h *handler) groups(w http.ResponseWriter, r *http.Request) {
	limit, ok := limitParam(w, r, 50, 500)
	if !ok {
		return
	}
	gs, err := h.svc.Groups(r.Context(), FilterFromQuery(r.URL.Query()), limit)
	h.reply(w, r, map[string]any{"groups": gs}, err)
}

func (h *handler) replay(w http.ResponseWriter, r *http.Request) {
	var req ReplayRequest
	if !decode(w, r, &req) {
		return
	}
	ctx, cancel := workContext(r)
	defer cancel()
	out, err := h.svc.Replay(ctx, caller(r), req)
	if err != nil {
		writeErr(w, h.log, r, err)
		return
	}
	code := http.StatusOK
	switch out.ErrorKind {
	case "count_changed":
		code = http.StatusConflict
	case "not_found":
		code = http.StatusNotFound
	case "stopped":
		code = http.StatusInternalServerError
	}
	if out.Repeated {
		w.Header().Set(RepeatedHeader, "true")
	}
	writeJSON(w, code, out)
}

func (h *handler) lag(w http.ResponseWriter, r *http.Request) {
	rep, err := h.svc.Lag(r.Context())
	h.reply(w, r, rep, err)
}

func (h *handler) relay(w http.ResponseWriter, r *http.Request) {
	st, err := h.svc.Relay(r.Context())
	h.reply(w, r, st, err)
}

func (h *handler) audit(w http.ResponseWriter, r *http.Request) {
	limit, ok := limitParam(w, r, 20, 200)
	if !ok {
		return
	}
	rows, err := h.svc.Audit(r.Context(), limit)
	h.reply(w, r, map[string]any{"audit": rows}, err)
}

func (h *handler) reply(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		writeErr(w, h.log, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func limitParam(w http.ResponseWriter, r *http.Request, def, most int) (int, bool) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > most {
		writeError(w, http.StatusBadRequest, "limit "+strconv.Quote(v)+": want 1 to "+strconv.Itoa(most))
		return 0, false
	}
	return n, true
}

// decode reads a JSON request body of at most 1 MiB with no unknown
// fields.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		writeError(w, http.StatusUnsupportedMediaType, "send the request as Content-Type: application/json")
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "request body: "+err.Error())
		return false
	}
	return true
}

func writeErr(w http.ResponseWriter, log *slog.Logger, r *http.Request, err error) {
	var bad *BadRequest
	switch {
	case errors.As(err, &bad):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrRequestIDReused):
		writeError(w, http.StatusUnprocessableEntity, err.Error())
	default:
		log.ErrorContext(r.Context(), "admin: request failed", slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("error", err.Error()))
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true)
	_ = enc.Encode(v)
}
