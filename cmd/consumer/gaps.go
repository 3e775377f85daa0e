package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// gapsConfig is the configuration of `consumer gaps …`.
type gapsConfig struct {
	DB           pgconn.Config
	Log          logConfig
	Actor        string
	All          bool
	ConsumerName string
	Note         string
	Producer     string
	RequestID    string
	Since        time.Duration
	Topic        string
}

// RegisterFlags registers the flags of the gaps commands.
func (c *gapsConfig) RegisterFlags(fs *flag.FlagSet, resolve bool) {
	c.DB.RegisterFlags(fs)
	c.Log.RegisterFlags(fs)
	fs.StringVar(&c.ConsumerName, "consumer-name", inbox.DefaultConsumerName, consumerNameHelp)
	if resolve {
		fs.StringVar(&c.Note, "note", "", "what was done about the missing events, or why they will not come (required)")
		fs.StringVar(&c.Actor, "actor", "", "who acts, for the audit (default: the OS user)")
		fs.StringVar(&c.RequestID, "request-id", "", "id of this change: a retry with the same id is not applied twice (default: a new random id)")
		fs.StringVar(&c.Producer, "producer", "", "the gap's stream: its producer, as consumer gaps list shows it (empty: the source's legacy stream)")
		fs.StringVar(&c.Topic, "topic", "", "the gap's stream: its topic (with -producer)")
		cli.Local(fs, "note", "actor", "request-id", "producer", "topic")
		return
	}
	fs.BoolVar(&c.All, "all", false, "list every given-up gap, however old and whether resolved or not")
	fs.DurationVar(&c.Since, "since", 24*time.Hour, "also list resolved given-up gaps given up within this window")
	cli.Local(fs, "all", "since")
}

// parseInterleaved parses flags that may come before, between or after the
// positional arguments, and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string, stderr io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args, stderr); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func runGapsList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer gaps list", flag.ContinueOnError)
	var cfg gapsConfig
	cfg.RegisterFlags(fs, false)
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("consumer gaps list: unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.DB.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	if err := cli.PositiveDuration("since", cfg.Since); err != nil && !cfg.All {
		return &cli.UsageError{Err: err}
	}
	pool, err := cfg.DB.Pool(ctx, "onceflow-consumer-gaps")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()
	since := time.Now().Add(-cfg.Since)
	if cfg.All {
		since = time.Time{}
	}
	store := &seqguard.PGStore{Consumer: cfg.ConsumerName}
	gaps, err := store.ListGaps(ctx, pool, true, since)
	if err != nil {
		return err
	}
	if len(gaps) == 0 {
		hintOtherConsumers(ctx, pool, qConsumersWithGaps, cfg.ConsumerName, "gaps", stderr)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tPRODUCER\tTOPIC\tRANGE\tSTATE\tOPENED\tDEADLINE / GIVEN UP\tREASON\tRESOLVED\tNOTE")
	dash := func(s string) string {
		if s == "" {
			return "-" // a legacy stream
		}
		return s
	}
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	for _, g := range gaps {
		when, reason, resolved := "deadline "+ts(g.Deadline), "-", "-"
		if g.GiveUpBy != "" {
			reason = "give-up asked by " + g.GiveUpBy
		}
		if g.State == "given_up" {
			reason = string(g.Reason)
			if g.GiveUpBy != "" {
				reason += " (" + g.GiveUpBy + ")"
			}
			if g.ClosedAt != nil {
				when = ts(*g.ClosedAt)
			}
			resolved = "no"
			if g.ResolvedAt != nil {
				resolved = ts(*g.ResolvedAt)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d-%d\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Source, dash(g.Producer), dash(g.Topic), g.From, g.To, g.State, ts(g.OpenedAt), when,
			reason, resolved, oneLine(g.ResolvedNote))
	}
	return tw.Flush()
}

func runGapsResolve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runGapChange(ctx, "resolve", args, stderr, func(svc *admin.Service, c admin.Caller, req gapRequest) error {
		out, err := svc.ResolveGap(ctx, c, admin.ResolveRequest(req))
		if err != nil {
			return err
		}
		switch out.ErrorKind {
		case "":
		case "not_found":
			return fmt.Errorf("%s %d-%d: no unresolved given-up gap in that range (see consumer gaps list)", req.Source, req.From, req.To)
		default:
			return fmt.Errorf("%s %d-%d: %s", req.Source, req.From, req.To, out.Error)
		}
		fmt.Fprintf(stdout, "%s %d-%d: resolved %d gap(s) (audit #%d)\n", req.Source, req.From, req.To, out.Resolved, out.AuditID)
		return nil
	})
}

func runGapsGiveUp(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runGapChange(ctx, "give-up", args, stderr, func(svc *admin.Service, c admin.Caller, req gapRequest) error {
		out, err := svc.GiveUpGap(ctx, c, admin.GiveUpRequest(req))
		if err != nil {
			return err
		}
		switch out.ErrorKind {
		case "":
		case "not_found":
			return fmt.Errorf("%s %d-%d: no open gap meets that range (see consumer gaps list; a gap already given up needs only consumer gaps resolve)", req.Source, req.From, req.To)
		default:
			return fmt.Errorf("%s %d-%d: %s", req.Source, req.From, req.To, out.Error)
		}
		ranges := make([]string, len(out.Gaps))
		for i, g := range out.Gaps {
			ranges[i] = fmt.Sprintf("%d-%d", g.From, g.To)
		}
		fmt.Fprintf(stdout, "%s: gap(s) %s to be given up now (audit #%d); the running consumer gives them up within its -gap-check-interval and applies the parked events behind them\n",
			req.Source, strings.Join(ranges, ", "), out.AuditID)
		return nil
	})
}

// gapRequest is what `consumer gaps resolve` and `consumer gaps give-up`
// send (admin.ResolveRequest and admin.GiveUpRequest have its fields).
type gapRequest struct {
	RequestID string `json:"request_id"`
	Source    string `json:"source"`
	Producer  string `json:"producer,omitempty"`
	Topic     string `json:"topic,omitempty"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
	Note      string `json:"note"`
}

// runGapChange parses `consumer gaps <verb> SOURCE FROM-TO -note …` and runs
// do with the admin service over a pool of its own.
func runGapChange(ctx context.Context, verb string, args []string, stderr io.Writer,
	do func(svc *admin.Service, c admin.Caller, req gapRequest) error) error {
	name := "consumer gaps " + verb
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var cfg gapsConfig
	cfg.RegisterFlags(fs, true)
	pos, err := parseInterleaved(fs, args, stderr)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return cli.Usagef("%s: want SOURCE FROM-TO (e.g. orders:42 7-9) and -note", name)
	}
	from, to, err := parseRange(pos[1])
	if err != nil {
		return cli.Usagef("%s: range %q: %v", name, pos[1], err)
	}
	if strings.TrimSpace(cfg.Note) == "" {
		return cli.Usagef("-note is required: say what was done about the missing events, or why they will not come")
	}
	if (cfg.Producer == "") != (cfg.Topic == "") {
		return cli.Usagef("-producer and -topic go together (both for a producer's stream, neither for a legacy stream)")
	}
	if err := cfg.DB.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	svc, pool, err := adminService(ctx, cfg.DB, cfg.ConsumerName, "onceflow-consumer-gaps")
	if err != nil {
		return err
	}
	defer pool.Close()
	if cfg.RequestID == "" {
		cfg.RequestID = newRequestID()
	}
	return do(svc, admin.Caller{Actor: cliActor(cfg.Actor), Via: "cli"},
		gapRequest{RequestID: cfg.RequestID, Source: pos[0], Producer: cfg.Producer, Topic: cfg.Topic, From: from, To: to, Note: cfg.Note})
}

// parseRange parses "7-9" or "7".
func parseRange(s string) (int64, int64, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		b = a
	}
	from, err := strconv.ParseInt(a, 10, 64)
	if err != nil {
		return 0, 0, errors.New("want FROM-TO, two seqs")
	}
	to, err := strconv.ParseInt(b, 10, 64)
	if err != nil {
		return 0, 0, errors.New("want FROM-TO, two seqs")
	}
	if from < 1 || to < from {
		return 0, 0, errors.New("want 1 <= FROM <= TO")
	}
	return from, to, nil
}
