package obs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing is a binary's tracer provider, configured from the standard
// OpenTelemetry environment variables. When nothing asks for an exporter it
// is a no-op provider: no span is recorded, nothing is exported, and the
// libraries skip their tracing work.
type Tracing struct {
	// Provider is what the libraries' Config.TracerProvider is set to.
	Provider trace.TracerProvider
	// Enabled reports whether spans are exported.
	Enabled bool
	// Endpoint is where spans go (when Enabled), without a password.
	Endpoint string

	sdk *sdktrace.TracerProvider
}

// The environment variables NewTracing reads itself; the SDK and the OTLP
// exporter read the others (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT,
// _COMPRESSION, _CERTIFICATE…, OTEL_BSP_*, OTEL_SPAN_*_LIMIT,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES).
const (
	envDisabled       = "OTEL_SDK_DISABLED"
	envExporter       = "OTEL_TRACES_EXPORTER"
	envEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	envTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	envProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	envSampler        = "OTEL_TRACES_SAMPLER"
	envSamplerArg     = "OTEL_TRACES_SAMPLER_ARG"
)

// NewTracing builds the tracer provider of the binary named service (the
// default service.name; OTEL_SERVICE_NAME wins). Spans are exported over
// OTLP/HTTP (protobuf) when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, or OTEL_TRACES_EXPORTER=otlp
// (then to the standard default, http://localhost:4318); never when
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. A setting this binary
// cannot honour (another protocol or exporter, an unknown sampler, a bad
// endpoint) is an error naming the variable. getenv is os.Getenv outside
// tests. Export errors are logged to log at WARN: NewTracing sets the
// process's global OpenTelemetry error handler, so call it from main only.
func NewTracing(ctx context.Context, service string, log *slog.Logger, getenv func(string) string) (*Tracing, error) {
	off := &Tracing{Provider: noop.NewTracerProvider()}
	if v := strings.ToLower(strings.TrimSpace(getenv(envDisabled))); v == "true" {
		return off, nil
	} else if v != "" && v != "false" {
		return nil, fmt.Errorf("%s=%q: want true or false", envDisabled, getenv(envDisabled))
	}
	exporter := strings.ToLower(strings.TrimSpace(getenv(envExporter)))
	endpoint := strings.TrimSpace(getenv(envTracesEndpoint))
	endpointVar := envTracesEndpoint
	if endpoint == "" {
		endpoint, endpointVar = strings.TrimSpace(getenv(envEndpoint)), envEndpoint
	}
	switch exporter {
	case "none":
		return off, nil
	case "":
		if endpoint == "" {
			return off, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("%s=%q: want otlp or none", envExporter, getenv(envExporter))
	}
	if endpoint == "" {
		endpoint, endpointVar = "http://localhost:4318", envEndpoint+" (default)"
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s: want an http or https URL such as http://collector:4318", endpointVar)
	}
	endpoint = u.Redacted()
	for _, name := range []string{envTracesProtocol, envProtocol} {
		if p := strings.TrimSpace(getenv(name)); p != "" && p != "http/protobuf" {
			return nil, fmt.Errorf("%s=%q: only http/protobuf is supported", name, p)
		}
	}
	if err := checkSampler(getenv(envSampler), getenv(envSamplerArg)); err != nil {
		return nil, err
	}

	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing resource (OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry", slog.Any("error", err))
	}))
	// The sampler comes from OTEL_TRACES_SAMPLER (default parentbased_always_on).
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	log.InfoContext(ctx, "tracing: exporting spans over OTLP/HTTP", slog.String("endpoint", endpoint),
		slog.String("service", serviceName(res, service)))
	return &Tracing{Provider: tp, Enabled: true, Endpoint: endpoint, sdk: tp}, nil
}

// Shutdown flushes the spans not yet exported and stops the exporter; a
// no-op when tracing is off. Call it once, on the way out, with a deadline.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	if err := t.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// ShutdownLogged is Shutdown within 5 seconds, logging the outcome: for a
// binary's way out (ctx must not be cancelled yet).
func (t *Tracing) ShutdownLogged(ctx context.Context, log *slog.Logger) {
	if t == nil || t.sdk == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		log.WarnContext(ctx, "tracing: spans may be lost", slog.Any("error", err))
		return
	}
	log.InfoContext(ctx, "tracing: spans flushed")
}

func serviceName(res *resource.Resource, def string) string {
	if v, ok := res.Set().Value(semconv.ServiceNameKey); ok {
		return v.AsString()
	}
	return def
}

// checkSampler refuses what the SDK would silently replace by its default.
func checkSampler(name, arg string) error {
	switch strings.TrimSpace(name) {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
		return nil
	case "traceidratio", "parentbased_traceidratio":
		if strings.TrimSpace(arg) == "" {
			return nil // ratio 1
		}
		r, err := strconv.ParseFloat(strings.TrimSpace(arg), 64)
		if err != nil || r < 0 || r > 1 {
			return fmt.Errorf("%s=%q: want a ratio between 0 and 1", envSamplerArg, arg)
		}
		return nil
	}
	return fmt.Errorf("%s=%q: want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio", envSampler, name)
}
