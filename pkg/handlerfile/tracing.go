package handlerfile

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/inbox"
)

// Attributes of the built-in handlers' spans (the engine's own are in
// package inbox).
const (
	attrIdemKey  = attribute.Key("onceflow.idempotency_key")
	attrReplayed = attribute.Key("onceflow.effect_replayed")
)

// w3c is the envelope's propagation format, whatever the process's global
// propagator is.
var w3c = propagation.TraceContext{}

// startHandler starts the span of a built-in handler's work for ev (kind
// "sql" or "http"), a child of the event's process span, and returns the
// context to do the work in. When the process span is not recorded, no span
// is started (the returned span is a no-op) but the context still carries
// the event's trace context, for the http handler's traceparent.
func startHandler(ctx context.Context, ev *inbox.Event, kind string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx = inbox.EventContext(ctx, *ev)
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return parent.TracerProvider().Tracer(inbox.TracerName).Start(ctx, "handler "+kind,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// endHandler ends a handler span; msg is the error's description for the
// span status (nil err: success).
func endHandler(span trace.Span, err error, msg string) {
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}

// httpSpanAttrs describe the endpoint without its path's query or userinfo.
func httpSpanAttrs(method, rawURL string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(method)}
	if u, err := url.Parse(rawURL); err == nil {
		attrs = append(attrs, semconv.URLScheme(u.Scheme), semconv.ServerAddress(u.Hostname()))
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err == nil {
				attrs = append(attrs, semconv.ServerPort(n))
			}
		}
	}
	return attrs
}

// httpErrorText describes a failed call for a span without repeating the
// URL (it may hold credentials).
func httpErrorText(err error) string {
	var se *httpStatusError
	var ne net.Error
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("http %d", se.Code)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "transport error"
}

// injectTraceparent sets traceparent (and tracestate) on an outbound
// request from ctx.
func injectTraceparent(ctx context.Context, h map[string][]string) {
	w3c.Inject(ctx, propagation.HeaderCarrier(h))
}
