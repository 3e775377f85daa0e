// Package handlerfile is the language of the consumer binary's handler file:
// built-in "sql", "log" and "http" handlers configured per event type in
// JSON, compiled into an inbox.BatchHandler. The engine (package inbox) knows
// nothing of it.
package handlerfile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// File is the configuration of the built-in handlers, read from a
// JSON file so that the consumer binary needs no Go code:
//
//	{
//	  "handlers": [
//	    {"event_type": "order.placed", "kind": "sql",
//	     "sql": "INSERT INTO shop.orders (id, total, seq) VALUES (:payload.order.id, :payload.total, :seq) ON CONFLICT (id) DO UPDATE SET total = EXCLUDED.total, seq = EXCLUDED.seq WHERE shop.orders.seq < EXCLUDED.seq"},
//	    {"event_type": "*", "kind": "log"}
//	  ]
//	}
//
// Kinds:
//   - "sql": one SQL statement run in the inbox transaction. Named
//     parameters (see below) are compiled once to positional $n parameters.
//   - "log": nothing beyond the inbox row (ledger mode).
//   - "http": the payload sent to a URL with an Idempotency-Key, fenced by
//     the effects ledger (see HTTPSpec).
//
// "event_type": "*" matches every type without its own entry. An event whose
// type matches nothing fails as a handler error and is dead-lettered.
//
// Parameters: :event_id, :source, :seq, :event_type, :content_type, :topic,
// :partition, :offset, :late, :payload (the payload as text, e.g.
// :payload::jsonb), :payload.a.b.0.c (a JSON path into the payload: object
// members and array indexes; a string is passed unquoted, a number, boolean,
// object or array as its JSON text, null or a missing path as NULL) and
// :header.name (an extra header, NULL when absent; the name may contain
// hyphens, :header.x-tenant, and is matched exactly, then ignoring case).
// Every value is sent as text (NULL aside) and Postgres converts it to the
// type the statement gives the parameter. "::" is a cast, not a parameter;
// quoted strings ('…', E'…' with backslash escapes), quoted identifiers and
// comments (--, and nested /* */) are left alone.
type File struct {
	Handlers []Spec `json:"handlers"`
}

// Spec configures the handler of one event type.
type Spec struct {
	EventType string    `json:"event_type"`
	Kind      string    `json:"kind"`
	SQL       string    `json:"sql,omitempty"`
	HTTP      *HTTPSpec `json:"http,omitempty"`
}

// Opt is an option of the handler file's compilation.
type Opt func(*fileOpts)

type fileOpts struct {
	afterHTTPCall func()
}

// OnAfterHTTPCall installs a hook the http handlers call after their
// downstream call returned and before the effects ledger records its result
// (the consumer binary installs the fault tests' failpoint through it).
func OnAfterHTTPCall(fn func()) Opt {
	return func(o *fileOpts) { o.afterHTTPCall = fn }
}

// Load reads a File from path and compiles it.
func Load(path string, opts ...Opt) (inbox.BatchHandler, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read handler file: %w", err)
	}
	h, err := Parse(b, opts...)
	if err != nil {
		return nil, fmt.Errorf("handler file %s: %w", path, err)
	}
	return h, nil
}

// Parse compiles a JSON File.
func Parse(data []byte, opts ...Opt) (inbox.BatchHandler, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	return f.Compile(opts...)
}

// Compile checks the file and builds its handler.
func (f File) Compile(opts ...Opt) (inbox.BatchHandler, error) {
	var o fileOpts
	for _, opt := range opts {
		opt(&o)
	}
	if len(f.Handlers) == 0 {
		return nil, fmt.Errorf("handlers: at least one is required")
	}
	h := &configured{byType: map[string]*compiled{}}
	for i, s := range f.Handlers {
		where := fmt.Sprintf("handlers[%d]", i)
		if s.EventType == "" {
			return nil, fmt.Errorf("%s.event_type is required (use \"*\" for every type)", where)
		}
		if h.byType[s.EventType] != nil {
			return nil, fmt.Errorf("%s.event_type %q is configured twice", where, s.EventType)
		}
		c := &compiled{kind: s.Kind}
		if s.HTTP != nil && s.Kind != "http" {
			return nil, fmt.Errorf("%s: kind %s takes no http", where, s.Kind)
		}
		switch s.Kind {
		case "log":
			if s.SQL != "" {
				return nil, fmt.Errorf("%s: kind log takes no sql", where)
			}
		case "sql":
			st, err := compileSQL(s.SQL)
			if err != nil {
				return nil, fmt.Errorf("%s.sql: %w", where, err)
			}
			c.stmt = st
		case "http":
			if s.SQL != "" {
				return nil, fmt.Errorf("%s: kind http takes no sql", where)
			}
			hh, err := compileHTTP(s.EventType, s.HTTP)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			hh.afterCall = o.afterHTTPCall
			c.http = hh
		default:
			return nil, fmt.Errorf("%s.kind %q: want sql, log or http", where, s.Kind)
		}
		h.byType[s.EventType] = c
	}
	for _, c := range h.byType {
		if c.kind == "http" {
			return &effecting{h}, nil
		}
	}
	return h, nil
}

type configured struct {
	byType map[string]*compiled
}

// effecting is a configuration with an http entry: an inbox.Effecter too
// (one without has no effect to make before the transaction, and skips that
// step's read).
type effecting struct {
	*configured
}

type compiled struct {
	kind string
	stmt *sqlStatement
	http *httpHandler
}

func (h *configured) lookup(eventType string) *compiled {
	if c := h.byType[eventType]; c != nil {
		return c
	}
	return h.byType["*"]
}

// Effect makes the external effect of an event whose entry is of kind
// http before its inbox transaction (inbox.Effecter): claimed in the effects
// ledger through db, sent with its Idempotency-Key while no connection is
// held, and recorded by HandleBatch in the transaction. Other kinds have no
// effect.
func (h *effecting) Effect(ctx context.Context, db *pgxpool.Pool, ev inbox.Event) (inbox.Prepared, error) {
	c := h.lookup(ev.EventType)
	if c == nil || c.kind != "http" {
		return nil, nil
	}
	return c.http.effect(ctx, db, ev)
}

// HandleBatch pipelines the events' statements in one round trip. With
// tracing, each sql statement gets a "handler sql" span (from queueing to its
// result) and each http call a "handler http" span, children of their
// event's process span.
func (h *configured) HandleBatch(ctx context.Context, tx pgx.Tx, evs []inbox.Event) error {
	var b pgx.Batch
	var queued []string
	var spans []trace.Span
	for i := range evs {
		c := h.lookup(evs[i].EventType)
		if c == nil {
			return &inbox.HandlerError{EventID: evs[i].EventID, Err: fmt.Errorf("no handler configured for event type %q", evs[i].EventType)}
		}
		if c.kind == "log" {
			continue
		}
		if c.kind == "http" {
			// A call made before the transaction: its record joins the
			// batch's pipeline (one round trip for the batch).
			if f, err := prepared(&evs[i]); err != nil {
				return &inbox.HandlerError{EventID: evs[i].EventID, Err: err}
			} else if f != nil {
				if f.res.Replayed {
					continue
				}
				sql, args, err := effects.RecordLeaseQuery(f.scope, f.key, f.eventID, f.res)
				if err != nil {
					return &inbox.HandlerError{EventID: evs[i].EventID, Err: err}
				}
				b.Queue(sql, args...)
				queued = append(queued, evs[i].EventID)
				spans = append(spans, trace.SpanFromContext(context.Background())) // the call had its span
				continue
			}
			if err := c.http.handle(ctx, tx, &evs[i]); err != nil {
				return &inbox.HandlerError{EventID: evs[i].EventID, Err: err}
			}
			continue
		}
		args, err := c.stmt.args(&evs[i])
		if err != nil {
			return &inbox.HandlerError{EventID: evs[i].EventID, Err: err}
		}
		b.Queue(c.stmt.sql, args...)
		queued = append(queued, evs[i].EventID)
		_, span := startHandler(ctx, &evs[i], "sql", semconv.DBSystemNamePostgreSQL, semconv.DBQueryText(c.stmt.sql))
		spans = append(spans, span)
	}
	if len(queued) == 0 {
		return nil
	}
	br := tx.SendBatch(ctx, &b)
	for i, id := range queued {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			endHandler(spans[i], err, err.Error())
			for _, s := range spans[i+1:] {
				endHandler(s, err, "not run: an earlier statement of the batch failed")
			}
			return &inbox.HandlerError{EventID: id, Err: err}
		}
		endHandler(spans[i], nil, "")
	}
	return br.Close()
}

// sqlStatement is a statement with named parameters compiled to $n.
type sqlStatement struct {
	sql    string
	params []param
}

type param struct {
	name string
	path []string // for payload.* and header.*
}

func compileSQL(src string) (*sqlStatement, error) {
	if strings.TrimSpace(src) == "" {
		return nil, fmt.Errorf("is empty")
	}
	var out strings.Builder
	st := &sqlStatement{}
	for i := 0; i < len(src); {
		ch := src[i]
		switch {
		case (ch == 'E' || ch == 'e') && i+1 < len(src) && src[i+1] == '\'' && (i == 0 || !isIdentChar(src[i-1])):
			// E'…': a backslash escapes the next character (E'it\'s :x').
			j := i + 2
			for j < len(src) {
				if src[j] == '\\' {
					j += 2
					continue
				}
				if src[j] == '\'' {
					if j+1 < len(src) && src[j+1] == '\'' { // doubled quote
						j += 2
						continue
					}
					break
				}
				j++
			}
			if j >= len(src) {
				return nil, fmt.Errorf("unterminated E'' string")
			}
			out.WriteString(src[i : j+1])
			i = j + 1
		case ch == '\'' || ch == '"':
			j := i + 1
			for j < len(src) {
				if src[j] == ch {
					if j+1 < len(src) && src[j+1] == ch { // doubled quote
						j += 2
						continue
					}
					break
				}
				j++
			}
			if j >= len(src) {
				return nil, fmt.Errorf("unterminated %c quote", ch)
			}
			out.WriteString(src[i : j+1])
			i = j + 1
		case ch == '-' && i+1 < len(src) && src[i+1] == '-':
			j := strings.IndexByte(src[i:], '\n')
			if j < 0 {
				j = len(src) - i
			}
			out.WriteString(src[i : i+j])
			i += j
		case ch == '/' && i+1 < len(src) && src[i+1] == '*':
			// Block comments nest in PostgreSQL.
			j, depth := i+2, 1
			for j < len(src) && depth > 0 {
				switch {
				case src[j] == '/' && j+1 < len(src) && src[j+1] == '*':
					depth++
					j += 2
				case src[j] == '*' && j+1 < len(src) && src[j+1] == '/':
					depth--
					j += 2
				default:
					j++
				}
			}
			if depth > 0 {
				return nil, fmt.Errorf("unterminated /* comment")
			}
			out.WriteString(src[i:j])
			i = j
		case ch == '$' && i+1 < len(src) && (i == 0 || !isIdentChar(src[i-1])) && (src[i+1] == '$' || isIdentChar(src[i+1])):
			return nil, fmt.Errorf("dollar quoting and positional parameters are not supported; use named parameters")
		case ch == ':' && i+1 < len(src) && src[i+1] == ':':
			out.WriteString("::")
			i += 2
		case ch == ':' && i+1 < len(src) && isIdentStart(src[i+1]):
			j := i + 1
			for j < len(src) && (isIdentChar(src[j]) || (src[j] == '.' && j+1 < len(src) && isIdentChar(src[j+1]))) {
				j++
			}
			if strings.HasPrefix(src[i+1:j], "header.") {
				// A header name may contain hyphens (:header.x-tenant): it
				// runs to the first character that is not a letter, digit,
				// '_' or '-'.
				for j < len(src) && (isIdentChar(src[j]) || src[j] == '-') {
					j++
				}
			}
			name := src[i+1 : j]
			p, err := parseParam(name)
			if err != nil {
				return nil, err
			}
			// Each occurrence is a parameter of its own: Postgres gives it
			// the type of its own place (:late into a text and a boolean
			// column in one statement).
			st.params = append(st.params, p)
			out.WriteString("$" + strconv.Itoa(len(st.params)))
			i = j
		default:
			out.WriteByte(ch)
			i++
		}
	}
	st.sql = out.String()
	return st, nil
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentChar(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

func parseParam(name string) (param, error) {
	switch name {
	case "event_id", "source", "seq", "event_type", "content_type", "topic", "partition", "offset", "late", "payload":
		return param{name: name}, nil
	}
	if rest, ok := strings.CutPrefix(name, "payload."); ok {
		return param{name: "payload.", path: strings.Split(rest, ".")}, nil
	}
	if rest, ok := strings.CutPrefix(name, "header."); ok {
		return param{name: "header.", path: []string{rest}}, nil
	}
	return param{}, fmt.Errorf("unknown parameter :%s (want event_id, source, seq, event_type, content_type, topic, partition, offset, late, payload, payload.<path> or header.<name>)", name)
}

// args are the statement's parameter values, every one as text (a string,
// or nil for NULL): Postgres converts text to the type the statement gives
// the parameter, so :late goes into a boolean or a text column alike.
func (s *sqlStatement) args(ev *inbox.Event) ([]any, error) {
	args := make([]any, len(s.params))
	var doc any
	parsed := false
	for i, p := range s.params {
		switch p.name {
		case "event_id":
			args[i] = ev.EventID
		case "source":
			args[i] = ev.Source
		case "seq":
			args[i] = strconv.FormatInt(ev.Seq, 10)
		case "event_type":
			args[i] = ev.EventType
		case "content_type":
			args[i] = ev.ContentType
		case "topic":
			args[i] = ev.Topic
		case "partition":
			args[i] = strconv.FormatInt(int64(ev.Partition), 10)
		case "offset":
			args[i] = strconv.FormatInt(ev.Offset, 10)
		case "late":
			args[i] = strconv.FormatBool(ev.Late)
		case "payload":
			args[i] = string(ev.Payload)
		case "header.":
			if v, ok := headerValue(ev.Headers, p.path[0]); ok {
				args[i] = v
			}
		case "payload.":
			if !parsed {
				dec := json.NewDecoder(bytes.NewReader(ev.Payload))
				dec.UseNumber()
				if err := dec.Decode(&doc); err != nil {
					return nil, fmt.Errorf("payload is not JSON: %w", err)
				}
				parsed = true
			}
			v, err := jsonPathText(doc, p.path)
			if err != nil {
				return nil, err
			}
			args[i] = v
		}
	}
	return args, nil
}

// headerValue looks a header up by its exact name, then ignoring case.
func headerValue(hs map[string]string, name string) (string, bool) {
	if v, ok := hs[name]; ok {
		return v, true
	}
	for k, v := range hs {
		if strings.EqualFold(k, name) {
			return v, true
		}
	}
	return "", false
}

// jsonPathText follows path through doc and returns the value as text (nil
// for null or a missing member).
func jsonPathText(doc any, path []string) (any, error) {
	cur := doc
	for _, seg := range path {
		switch v := cur.(type) {
		case map[string]any:
			cur = v[seg]
		case []any:
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 || n >= len(v) {
				cur = nil
			} else {
				cur = v[n]
			}
		default:
			cur = nil
		}
		if cur == nil {
			return nil, nil
		}
	}
	switch v := cur.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return strconv.FormatBool(v), nil
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		return string(b), nil
	}
}
