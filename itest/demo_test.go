package itest

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestDemo runs `make demo`'s program briefly, as a new user would get it:
// a throwaway PostgreSQL, the embedded Kafka, the real relay and consumer
// binaries, and chaos on. It must exit 0 and its summary must show the
// guarantees: every event applied once, duplicates suppressed, kills
// survived, and the never-filled gap given up with its alert line.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts PostgreSQL and the binaries")
	}
	t.Parallel()
	bin := testkit.Binary(t, "demo")
	cmd := exec.Command(bin, "-bin-dir", filepath.Dir(bin), "-duration", "15s", "-rate", "150", "-gap-timeout", "3s")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("demo ran %s:\n%s", time.Since(start).Round(time.Second), out)
	if err != nil {
		t.Fatalf("demo failed: %v", err)
	}
	for _, want := range []string{
		"== summary",
		"duplicate copies injected",
		"SIGKILLed",
		"gap given up (on-call alerted)   chaos:never-filled seq 3–3",
		`"level":"ERROR","msg":"sequence gap given up`,
		"gap filled in time",
		"OK: side effects executed (",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo summary lacks %q", want)
		}
	}
}
