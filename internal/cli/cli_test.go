package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A deprecated spelling sets the flag it stands for, reads no environment
// variable (its old name may mean something else in another binary) and is
// listed without one.
func TestDeprecated(t *testing.T) {
	newFS := func() (*flag.FlagSet, *time.Duration) {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		d := fs.Duration("retention-interval", 0, "how often")
		Deprecated(fs, "prune-interval", "retention-interval")
		return fs, d
	}
	fs, d := newFS()
	if err := Parse(fs, []string{"-prune-interval", "10m"}); err != nil || *d != 10*time.Minute {
		t.Fatalf("-prune-interval 10m: %v, retention-interval %s", err, *d)
	}
	t.Setenv("ONCEFLOW_PRUNE_INTERVAL", "1s")
	fs, d = newFS()
	if err := Parse(fs, nil); err != nil || *d != 0 {
		t.Fatalf("ONCEFLOW_PRUNE_INTERVAL was read: %v, retention-interval %s", err, *d)
	}
	t.Setenv("ONCEFLOW_RETENTION_INTERVAL", "2m")
	fs, d = newFS()
	if err := Parse(fs, nil); err != nil || *d != 2*time.Minute {
		t.Fatalf("ONCEFLOW_RETENTION_INTERVAL: %v, retention-interval %s", err, *d)
	}
	var out bytes.Buffer
	Usage(fs, &out)
	if strings.Contains(out.String(), "ONCEFLOW_PRUNE_INTERVAL") || !strings.Contains(out.String(), "-prune-interval  (deprecated: use -retention-interval)") {
		t.Fatalf("usage:\n%s", out.String())
	}
}

func TestExitCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{flag.ErrHelp, 0},
		{Usagef("-limit (ONCEFLOW_LIMIT) must be at least 1"), 2},
		{fmt.Errorf("run: %w", Usagef("bad")), 2},
		{errors.New("connect to database: refused"), 1},
	} {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}
