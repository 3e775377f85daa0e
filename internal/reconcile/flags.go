package reconcile

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/onceflow/onceflow/internal/cli"
)

// Flags are the command-line flags of a run's window, topics and bounds,
// the same for `consumer reconcile` and `relay reconcile`.
type Flags struct {
	ClockMargin  time.Duration
	From, To     string
	FromID, ToID int64
	JSON         bool
	MaxRanges    int
	Settle       time.Duration
	Since        time.Duration
	Timeout      time.Duration
	Topics       cli.List
}

// Register adds the flags to fs. All but -topics are choices of one
// invocation and read no environment variable.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.Var(&f.Topics, "topics", "comma-separated topics to reconcile (required)")
	fs.DurationVar(&f.Since, "since", time.Hour, "window: the outbox rows committed this long ago until now (unless -from or -from-id)")
	fs.StringVar(&f.From, "from", "", "window start, RFC 3339 (instead of -since)")
	fs.StringVar(&f.To, "to", "", "window end, RFC 3339 (default: now)")
	fs.Int64Var(&f.FromID, "from-id", 0, "window: outbox ids from this one (instead of a time window)")
	fs.Int64Var(&f.ToID, "to-id", 0, "with -from-id: the last outbox id (default: no limit)")
	fs.DurationVar(&f.Settle, "settle", DefaultSettle, "leave out the rows committed this recently (the relay may not have published them yet)")
	fs.DurationVar(&f.ClockMargin, "clock-margin", DefaultClockMargin, "how far the clocks of the database, relay and consumer may disagree")
	fs.IntVar(&f.MaxRanges, "max-ranges", DefaultMaxRanges, "memory bound: most seq ranges held (about 16 bytes each, a stream counts 32); beyond it the run stops (status 2)")
	fs.BoolVar(&f.JSON, "json", false, "print the report as JSON instead of the summary")
	fs.DurationVar(&f.Timeout, "timeout", 10*time.Minute, "give up the run after this long (status 2)")
	cli.Local(fs, "since", "from", "to", "from-id", "to-id", "settle", "clock-margin", "max-ranges", "json", "timeout")
}

// Apply checks the flags (set names those given on the command line) and
// fills rc's window, topics and bounds.
func (f *Flags) Apply(set map[string]bool, rc *Config) error {
	rc.ClockMargin, rc.FromID, rc.ToID, rc.MaxRanges, rc.Settle, rc.Topics = f.ClockMargin, f.FromID, f.ToID, f.MaxRanges, f.Settle, f.Topics
	if f.Settle == 0 {
		rc.Settle = -1 // none (the engine's zero is its default)
	}
	switch {
	case len(f.Topics) == 0:
		return fmt.Errorf("%s is required", cli.Named("topics"))
	case f.MaxRanges < 1:
		return fmt.Errorf("-max-ranges must be at least 1, got %d", f.MaxRanges)
	case f.Settle < 0 || f.ClockMargin < 0:
		return errors.New("-settle and -clock-margin must not be negative")
	case f.Timeout <= 0:
		return fmt.Errorf("-timeout must be positive, got %s", f.Timeout)
	}
	byTime := set["since"] || set["from"] || set["to"]
	byID := set["from-id"] || set["to-id"]
	switch {
	case byTime && byID:
		return errors.New("a time window (-since, -from, -to) or an id range (-from-id, -to-id), not both")
	case set["since"] && set["from"]:
		return errors.New("-since or -from, not both")
	case byID:
		if f.FromID < 1 {
			return fmt.Errorf("-from-id must be at least 1, got %d", f.FromID)
		}
		if f.ToID != 0 && f.ToID < f.FromID {
			return fmt.Errorf("-to-id (%d) must be at least -from-id (%d)", f.ToID, f.FromID)
		}
		return nil
	}
	now := time.Now()
	if f.To != "" {
		to, err := time.Parse(time.RFC3339, f.To)
		if err != nil {
			return fmt.Errorf("-to: want an RFC 3339 time, got %q", f.To)
		}
		rc.To, now = to, to
	}
	if f.From != "" {
		from, err := time.Parse(time.RFC3339, f.From)
		if err != nil {
			return fmt.Errorf("-from: want an RFC 3339 time, got %q", f.From)
		}
		rc.From = from
	} else {
		if f.Since <= 0 {
			return fmt.Errorf("-since must be positive, got %s", f.Since)
		}
		rc.From = now.Add(-f.Since)
	}
	if !rc.To.IsZero() && !rc.To.After(rc.From) {
		return errors.New("-to must be after -from")
	}
	return nil
}

// Print writes rep as the summary, or as JSON with -json.
func (f *Flags) Print(w io.Writer, rep *Report) error {
	if f.JSON {
		return WriteJSON(w, rep)
	}
	return WriteText(w, rep)
}

// CouldNotRun is the command's error for a run that could not finish:
// exit status 2.
func CouldNotRun(err error) error {
	return &cli.StatusError{Status: 2, Err: fmt.Errorf("reconcile could not run: %w", err)}
}

// Verdict is the command's result for a finished run: nil when clean,
// exit status 1 naming the anomalies otherwise.
func Verdict(rep *Report) error {
	if rep.Clean() {
		return nil
	}
	return &cli.StatusError{Status: 1, Err: fmt.Errorf("reconcile: %d anomalies", rep.Anomalies)}
}
