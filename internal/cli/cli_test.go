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
		{&StatusError{Status: 2, Err: errors.New("reconcile: topics: not found")}, 2},
		{fmt.Errorf("reconcile: %w", &StatusError{Status: 1, Err: errors.New("3 anomalies")}), 1},
	} {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// A library's complaint about a field names the flag and its environment
// variable, with the other fields of the reason named as flags too.
func TestFieldsError(t *testing.T) {
	t.Parallel()
	m := Fields{"LeaseRenewInterval": "lease-renew-interval", "LeaseTTL": "lease-ttl"}
	err := m.Error("outbox config", "LeaseRenewInterval", "(2s) must be at most half of LeaseTTL (3s)")
	want := "-lease-renew-interval (ONCEFLOW_LEASE_RENEW_INTERVAL) (2s) must be at most half of -lease-ttl (3s)"
	if err.Error() != want || ExitCode(err) != 2 {
		t.Fatalf("got %q (exit %d), want %q (exit 2)", err, ExitCode(err), want)
	}
	if err := m.Error("outbox config", "DB", "is required"); err.Error() != "outbox config: DB is required" || ExitCode(err) != 2 {
		t.Fatalf("unmapped field: %q", err)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Duration("lease-ttl", 0, "")
	if err := m.Check(fs); err == nil || !strings.Contains(err.Error(), "-lease-renew-interval") {
		t.Fatalf("Check: %v", err)
	}
}

// A typed flag writes straight into its field; a value it refuses is named
// by flag and variable, from the command line and from the environment.
func TestVarAndValueErrors(t *testing.T) {
	parseLevel := func(s string) (int, error) {
		switch s {
		case "low":
			return 1, nil
		case "high":
			return 2, nil
		}
		return 0, fmt.Errorf("want low or high")
	}
	newFS := func() (*flag.FlagSet, *int, *int32) {
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		level, n := 2, int32(0)
		Var(fs, &level, "level", "how much", parseLevel, func(v int) string { return map[int]string{1: "low", 2: "high"}[v] })
		Int32Var(fs, &n, "fetch-bytes", 7, "bytes")
		return fs, &level, &n
	}
	fs, level, n := newFS()
	if fs.Lookup("level").DefValue != "high" || fs.Lookup("fetch-bytes").DefValue != "7" || *n != 7 {
		t.Fatalf("defaults %q %q", fs.Lookup("level").DefValue, fs.Lookup("fetch-bytes").DefValue)
	}
	if err := Parse(fs, []string{"-level", "low", "-fetch-bytes", "9"}); err != nil || *level != 1 || *n != 9 {
		t.Fatalf("Parse: %v, level %d, n %d", err, *level, *n)
	}
	fs, _, _ = newFS()
	err := Parse(fs, []string{"-level", "mid"})
	if want := `-level (ONCEFLOW_LEVEL): invalid value "mid": want low or high`; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	fs, _, _ = newFS()
	if err := Parse(fs, []string{"-fetch-bytes", "3000000000"}); err == nil || !strings.HasPrefix(err.Error(), "-fetch-bytes (ONCEFLOW_FETCH_BYTES): invalid value") {
		t.Fatalf("out of range: %v", err)
	}
	t.Setenv("ONCEFLOW_LEVEL", "mid")
	fs, _, _ = newFS()
	if err := Parse(fs, nil); err == nil || !strings.Contains(err.Error(), `ONCEFLOW_LEVEL="mid"`) {
		t.Fatalf("env: %v", err)
	}
}

// A Local flag reads no environment variable, is listed as flag only, and
// its errors name no variable.
func TestLocal(t *testing.T) {
	newFS := func() (*flag.FlagSet, *string, *bool, *int) {
		fs := flag.NewFlagSet("dlq replay", flag.ContinueOnError)
		note := fs.String("note", "", "why")
		all := fs.Bool("all", false, "everything")
		limit := fs.Int("limit", 100, "most")
		Local(fs, "note", "all", "limit")
		return fs, note, all, limit
	}
	t.Setenv("ONCEFLOW_NOTE", "from the environment")
	t.Setenv("ONCEFLOW_ALL", "true")
	fs, note, all, _ := newFS()
	if err := Parse(fs, nil); err != nil || *note != "" || *all {
		t.Fatalf("environment read: %v, note %q, all %v", err, *note, *all)
	}
	fs, note, all, _ = newFS()
	if err := Parse(fs, []string{"-all", "-note", "n"}); err != nil || *note != "n" || !*all {
		t.Fatalf("flags: %v, note %q, all %v", err, *note, *all)
	}
	fs, _, _, _ = newFS()
	if err := Parse(fs, []string{"-limit", "x"}); err == nil || err.Error() != `-limit: invalid value "x": parse error` {
		t.Fatalf("limit: %v", err)
	}
	if got := Flag(fs, "note"); got != "-note" {
		t.Fatalf("Flag(note) = %q", got)
	}
	var out bytes.Buffer
	Usage(fs, &out)
	if !strings.Contains(out.String(), "  -note  [flag only]\n") || strings.Contains(out.String(), "ONCEFLOW_") {
		t.Fatalf("usage:\n%s", out.String())
	}
}
