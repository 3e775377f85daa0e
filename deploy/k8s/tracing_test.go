package k8s_test

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/obs"
)

// TestTracingSettings: every OTEL_* variable a container gets is one the
// binaries read (named in docs/tracing.md), each `run` container names its
// own binary as OTEL_SERVICE_NAME, and the settings pass the binaries' own
// check (obs.NewTracing) once an endpoint is set, as an operator would set
// it by uncommenting OTEL_EXPORTER_OTLP_ENDPOINT.
func TestTracingSettings(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/tracing.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, n := range regexp.MustCompile(`OTEL_[A-Z_]+[A-Z]`).FindAllString(string(doc), -1) {
		documented[n] = true
	}
	for _, dir := range overlays {
		for _, ct := range containers(t, dir) {
			for name := range ct.Env {
				if strings.HasPrefix(name, "OTEL_") && !documented[name] {
					t.Errorf("%s sets %s, which docs/tracing.md does not name (the binaries do not read it)", ct.Where, name)
				}
			}
			bin, sub, _ := command(ct.C)
			if len(sub) == 0 || sub[0] != "run" {
				continue
			}
			if got, want := ct.Env["OTEL_SERVICE_NAME"], "onceflow-"+bin; got != want {
				t.Errorf("%s: OTEL_SERVICE_NAME %q, want %q", ct.Where, got, want)
			}
			env := maps.Clone(ct.Env)
			if env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "" {
				env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://otel-collector.observability.svc:4318"
			}
			tr, err := obs.NewTracing(context.Background(), "onceflow-"+bin, slog.New(slog.DiscardHandler), func(k string) string { return env[k] })
			if err != nil {
				t.Errorf("%s: the binary would refuse its tracing settings: %v", ct.Where, err)
				continue
			}
			if !tr.Enabled {
				t.Errorf("%s: tracing stays off with an endpoint set", ct.Where)
			}
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Errorf("%s: %v", ct.Where, err)
			}
		}
	}
}
