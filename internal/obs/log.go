// Package obs builds the binaries' loggers and their OpenTelemetry tracer
// provider.
package obs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// NewLogger returns a slog logger writing to w in format "json" (default) or
// "text" at level debug, info (default), warn or error. Every record logged
// with a context that carries a span gets trace_id and span_id (see
// TraceHandler).
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "", "info":
		lv = slog.LevelInfo
	case "debug":
		lv = slog.LevelDebug
	case "warn", "warning":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "", "json":
		return slog.New(TraceHandler(slog.NewJSONHandler(w, opts))), nil
	case "text":
		return slog.New(TraceHandler(slog.NewTextHandler(w, opts))), nil
	default:
		return nil, fmt.Errorf("log format %q: want json or text", format)
	}
}

// Attribute keys TraceHandler adds.
const (
	TraceIDKey = "trace_id"
	SpanIDKey  = "span_id"
)

// TraceHandler wraps h so that a record logged with a context carrying a
// valid span context (a span of this process, or the remote parent an event
// brought along) gets the attributes trace_id and span_id, in the W3C hex
// form tracing backends search by. Records without one are passed on
// unchanged, at no cost.
func TraceHandler(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ h slog.Handler }

func (t traceHandler) Enabled(ctx context.Context, l slog.Level) bool { return t.h.Enabled(ctx, l) }

func (t traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String(TraceIDKey, sc.TraceID().String()), slog.String(SpanIDKey, sc.SpanID().String()))
	}
	return t.h.Handle(ctx, r)
}

func (t traceHandler) WithAttrs(as []slog.Attr) slog.Handler { return traceHandler{t.h.WithAttrs(as)} }

func (t traceHandler) WithGroup(name string) slog.Handler { return traceHandler{t.h.WithGroup(name)} }
