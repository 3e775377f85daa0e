package obs

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// A record logged with a context carrying a span gets trace_id and span_id;
// one without does not; attributes and groups pass through.
func TestTraceHandler(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(TraceHandler(slog.NewJSONHandler(&buf, nil))).With("component", "x")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	log.InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "inside", "k", 1)
	log.InfoContext(context.Background(), "outside")
	log.Info("no context")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines: %s", len(lines), buf.String())
	}
	var in map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &in); err != nil {
		t.Fatal(err)
	}
	if in["trace_id"] != sc.TraceID().String() || in["span_id"] != sc.SpanID().String() || in["component"] != "x" || in["k"] != 1.0 {
		t.Errorf("inside a span: %v", in)
	}
	for _, l := range lines[1:] {
		if strings.Contains(l, "trace_id") {
			t.Errorf("outside a span: %s", l)
		}
	}
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// Tracing is off (a no-op provider, nothing exported) unless an endpoint or
// OTEL_TRACES_EXPORTER=otlp asks for it; settings the binaries cannot honour
// are errors naming the variable.
func TestNewTracing(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	for _, tt := range []struct {
		name    string
		env     map[string]string
		enabled bool
		err     string
	}{
		{"nothing set", nil, false, ""},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, ""},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:4318/v1/traces"}, true, ""},
		{"exporter otlp, default endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, ""},
		{"exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false, ""},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false, ""},
		{"ratio sampler", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1"}, true, ""},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"console exporter", map[string]string{"OTEL_TRACES_EXPORTER": "console"}, false, "OTEL_TRACES_EXPORTER"},
		{"bad endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, false, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"unknown sampler", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "jaeger_remote"}, false, "OTEL_TRACES_SAMPLER"},
		{"bad ratio", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, false, "OTEL_TRACES_SAMPLER_ARG"},
		{"bad disabled", map[string]string{"OTEL_SDK_DISABLED": "yes"}, false, "OTEL_SDK_DISABLED"},
	} {
		tr, err := NewTracing(ctx, "svc", log, env(tt.env))
		if tt.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
				t.Errorf("%s: err %v, want one naming %s", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		_, span := tr.Provider.Tracer("t").Start(ctx, "s")
		if tr.Enabled != tt.enabled || span.IsRecording() != tt.enabled {
			t.Errorf("%s: enabled %v recording %v, want %v", tt.name, tr.Enabled, span.IsRecording(), tt.enabled)
		}
		span.End()
		sctx, cancel := context.WithCancel(ctx)
		cancel() // nothing to flush; do not wait for the fake endpoints
		_ = tr.Shutdown(sctx)
	}
}
