package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// effectsConfig is the configuration of `consumer effects …`.
type effectsConfig struct {
	DB           pgconn.Config
	Log          logConfig
	ConsumerName string
	// held
	Limit       int
	ScopePrefix string
	// resolve, unhold
	Actor     string
	Code      int
	Note      string
	RequestID string
	Result    string
	Scope     string
}

// RegisterFlags registers the flags of the effects commands.
func (c *effectsConfig) RegisterFlags(fs *flag.FlagSet, verb string) {
	c.DB.RegisterFlags(fs)
	c.Log.RegisterFlags(fs)
	fs.StringVar(&c.ConsumerName, "consumer-name", inbox.DefaultConsumerName, consumerNameHelp)
	if verb == "held" {
		fs.IntVar(&c.Limit, "limit", 100, "most held effects to list")
		fs.StringVar(&c.ScopePrefix, "scope-prefix", "", "list only the scopes starting with this; default the consumer's scopes (inbox/<consumer name>/) and the scopes of no consumer (a library's, an agent's)")
		cli.Local(fs, "limit", "scope-prefix")
		return
	}
	fs.StringVar(&c.Scope, "scope", "", "the held effect's scope, as consumer effects held shows it (empty: the scope of effects.Do); not another consumer's")
	fs.StringVar(&c.Note, "note", "", "what the downstream did (resolve), or why the effect may be sent again (unhold) (required)")
	fs.StringVar(&c.Actor, "actor", "", "who acts, for the audit (default: the OS user)")
	fs.StringVar(&c.RequestID, "request-id", "", "id of this change: a retry with the same id is not applied twice (default: a new random id)")
	names := []string{"scope", "note", "actor", "request-id"}
	if verb == "resolve" {
		fs.IntVar(&c.Code, "code", 0, "the result code found downstream (e.g. the HTTP status of the object), recorded as the effect's result_code")
		fs.StringVar(&c.Result, "result", "", `the result found downstream, a JSON document (e.g. {"id":"ch_123"}), recorded as the effect's result`)
		names = append(names, "code", "result")
	}
	cli.Local(fs, names...)
}

func runEffectsHeld(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("consumer effects held", flag.ContinueOnError)
	var cfg effectsConfig
	cfg.RegisterFlags(fs, "held")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("consumer effects held: unexpected argument %q", fs.Arg(0))
	}
	if cfg.Limit < 1 {
		return cli.Usagef("-limit must be at least 1, got %d", cfg.Limit)
	}
	if err := cfg.DB.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	svc, pool, err := adminService(ctx, cfg.DB, cfg.ConsumerName, "onceflow-consumer-effects")
	if err != nil {
		return err
	}
	defer pool.Close()
	held, err := svc.HeldEffects(ctx, cfg.ScopePrefix, cfg.Limit)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tKEY\tEVENT ID\tATTEMPTS\tFIRST CLAIM\tHELD\tREASON")
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	for _, h := range held {
		ev := h.EventID
		if ev == "" {
			ev = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", h.Scope, h.Key, ev, h.Attempts, ts(h.Created), ts(h.HeldAt), oneLine(h.Reason))
	}
	return tw.Flush()
}

func runEffectsResolve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runEffectChange(ctx, "resolve", args, stdout, stderr, (*admin.Service).ResolveEffect)
}

func runEffectsUnhold(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runEffectChange(ctx, "unhold", args, stdout, stderr, (*admin.Service).UnholdEffect)
}

// runEffectChange parses `consumer effects <verb> KEY -scope S -note …` and
// runs do with the admin service over a pool of its own.
func runEffectChange(ctx context.Context, verb string, args []string, stdout, stderr io.Writer,
	do func(*admin.Service, context.Context, admin.Caller, admin.EffectRequest) (admin.EffectOutcome, error)) error {
	name := "consumer effects " + verb
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var cfg effectsConfig
	cfg.RegisterFlags(fs, verb)
	pos, err := parseInterleaved(fs, args, stderr)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return cli.Usagef("%s: want one KEY (as consumer effects held shows it), -scope and -note", name)
	}
	if strings.TrimSpace(cfg.Note) == "" {
		return cli.Usagef("-note is required: say what the downstream did, or why the effect may be sent again")
	}
	if cfg.Result != "" && !json.Valid([]byte(cfg.Result)) {
		return cli.Usagef("-result is not JSON")
	}
	if err := cfg.DB.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	svc, pool, err := adminService(ctx, cfg.DB, cfg.ConsumerName, "onceflow-consumer-effects")
	if err != nil {
		return err
	}
	defer pool.Close()
	if cfg.RequestID == "" {
		cfg.RequestID = newRequestID()
	}
	req := admin.EffectRequest{RequestID: cfg.RequestID, Scope: cfg.Scope, Key: pos[0], Note: cfg.Note, Code: cfg.Code}
	if cfg.Result != "" {
		req.Result = json.RawMessage(cfg.Result)
	}
	out, err := do(svc, ctx, admin.Caller{Actor: cliActor(cfg.Actor), Via: "cli"}, req)
	var bad *admin.BadRequest
	if errors.As(err, &bad) {
		return cli.Usagef("%s: %v", name, err)
	}
	if err != nil {
		return err
	}
	if out.ErrorKind != "" {
		return fmt.Errorf("%s (scope %q): %s (see consumer effects held)", req.Key, req.Scope, out.Error)
	}
	what := "resolved: later claims replay the recorded result, nothing is sent; replay its dead-lettered event"
	if verb == "unhold" {
		what = "unheld: its window restarts now, and the next claim sends it with the same key; replay its dead-lettered event"
	}
	fmt.Fprintf(stdout, "%s (scope %q) %s (audit #%d)\n", req.Key, req.Scope, what, out.AuditID)
	return nil
}
