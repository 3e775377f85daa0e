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

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/pkg/dbtx"
	"github.com/onceflow/onceflow/pkg/relay"
	"github.com/onceflow/onceflow/pkg/relay/admin"
)

// The operator commands:
//
//	relay identity show   [-shard S] [-transactional-id-prefix P]
//	relay identity adopt  -note "…"    this database replaces the one its identity was made in
//	relay identity reset  -note "…"    this database is a separate copy: new identity
//	relay identity legacy adopt|discard -shard S -note "…"
//	relay outbox failed list  [-all]
//	relay outbox failed retry ID [-note "…"]
//	relay outbox failed skip  ID -note "…"

const adminUsage = `usage:
  relay identity show [flags]
  relay identity adopt -note "…" [flags]
  relay identity reset -note "…" [flags]
  relay identity legacy adopt|discard -shard S -note "…" [flags]
  relay outbox failed list [-all] [flags]
  relay outbox failed retry ID [-note "…"] [flags]
  relay outbox failed skip ID -note "…" [flags]
`

// adminConfig is the configuration of the operator commands.
type adminConfig struct {
	db        pgconn.Config
	all       bool
	note      string
	shard     string
	txnPrefix string
}

// RegisterFlags registers the flags of one operator command.
func (c *adminConfig) RegisterFlags(fs *flag.FlagSet, cmd string) {
	c.db.RegisterFlags(fs)
	switch cmd {
	case "identity show":
		fs.StringVar(&c.shard, "shard", relay.DefaultShard, shardHelp)
		fs.StringVar(&c.txnPrefix, "transactional-id-prefix", "", txnIDPrefixHelp)
	case "identity adopt", "identity reset":
		fs.StringVar(&c.note, "note", "", "why (required; kept in onceflow.database_identity)")
	case "identity legacy":
		fs.StringVar(&c.shard, "shard", relay.DefaultShard, shardHelp)
		fs.StringVar(&c.note, "note", "", "why (required; kept with the decision)")
	case "outbox failed list":
		fs.BoolVar(&c.all, "all", false, "also list resolved entries (published after a retry, or skipped)")
	case "outbox failed retry":
		fs.StringVar(&c.note, "note", "", "what was fixed (kept with the entry)")
	case "outbox failed skip":
		fs.StringVar(&c.note, "note", "", "why the event is given up (required; kept with the entry)")
	}
	// Per-invocation choices read no environment variable.
	for _, name := range []string{"note", "all"} {
		if fs.Lookup(name) != nil {
			cli.Local(fs, name)
		}
	}
}

// positionalArgs are the positional arguments of the commands that take
// some, for their usage line.
var positionalArgs = map[string]string{
	"relay outbox failed retry": " ID",
	"relay outbox failed skip":  " ID",
}

// parseInterleaved parses flags that may come before, between or after the
// positional arguments, and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := cli.Parse(fs, args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(stdout, "usage: %s%s [flags]\n", fs.Name(), positionalArgs[fs.Name()])
				cli.Usage(fs, stdout)
				return nil, err
			}
			return nil, &cli.UsageError{Err: err}
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// runAdmin runs `relay identity …` or `relay outbox failed …`; words are
// the subcommand words after "relay".
func runAdmin(ctx context.Context, words []string, stdout io.Writer) error {
	var cmd string
	var rest []string
	switch {
	case len(words) >= 2 && words[0] == "identity" && (words[1] == "show" || words[1] == "adopt" || words[1] == "reset"):
		cmd, rest = "identity "+words[1], words[2:]
	case len(words) >= 3 && words[0] == "identity" && words[1] == "legacy" && (words[2] == "adopt" || words[2] == "discard"):
		cmd, rest = "identity legacy", words[2:]
	case len(words) >= 3 && words[0] == "outbox" && words[1] == "failed" && (words[2] == "list" || words[2] == "retry" || words[2] == "skip"):
		cmd, rest = "outbox failed "+words[2], words[3:]
	default:
		fmt.Fprint(stdout, adminUsage)
		if len(words) > 0 && (words[len(words)-1] == "-help" || words[len(words)-1] == "-h") {
			return flag.ErrHelp
		}
		return cli.Usagef("unknown command %q", "relay "+strings.Join(words, " "))
	}
	var c adminConfig
	name := "relay " + cmd
	if cmd == "identity legacy" {
		name += " " + rest[0]
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	c.RegisterFlags(fs, cmd)
	pos, err := parseInterleaved(fs, rest, stdout)
	if err != nil {
		return err
	}
	if err := c.db.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	needNote := cmd == "identity adopt" || cmd == "identity reset" || cmd == "identity legacy" || cmd == "outbox failed skip"
	if needNote && strings.TrimSpace(c.note) == "" {
		return cli.Usagef("%s: -note is required: say why", name)
	}
	var id int64
	switch cmd {
	case "identity legacy":
		if len(pos) != 1 {
			return cli.Usagef("%s: unexpected arguments %q", name, pos[1:])
		}
	case "outbox failed retry", "outbox failed skip":
		if len(pos) != 1 {
			return cli.Usagef("%s: want the outbox id of one set-aside row (see relay outbox failed list)", name)
		}
		if id, err = strconv.ParseInt(pos[0], 10, 64); err != nil {
			return cli.Usagef("%s: %q is not an outbox id", name, pos[0])
		}
	default:
		if len(pos) > 0 {
			return cli.Usagef("%s: unexpected argument %q", name, pos[0])
		}
	}
	pool, err := c.db.Pool(ctx, "onceflow-relay-admin")
	if err != nil {
		return fmt.Errorf("database pool: %w", err)
	}
	defer pool.Close()

	switch cmd {
	case "identity show":
		return identityShow(ctx, pool, c, stdout)
	case "identity adopt":
		idn, err := admin.AdoptIdentity(ctx, pool, c.note)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "identity %s adopted: it now belongs to %s\n", idn.ID, idn.Place)
	case "identity reset":
		idn, err := admin.ResetIdentity(ctx, pool, c.note)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "new identity %s for %s; restart the relays\n", idn.ID, idn.Place)
	case "identity legacy":
		err := admin.DecideLegacyCheckpoint(ctx, pool, c.shard, pos[0], c.note)
		if errors.Is(err, admin.ErrNoLegacyCheckpoint) {
			return fmt.Errorf("shard %q: %w (relay identity show lists them)", c.shard, err)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "shard %q: legacy checkpoint will be %sed at the relay's next start (note: %s)\n", c.shard, pos[0], c.note)
	case "outbox failed list":
		return failedList(ctx, pool, c.all, stdout)
	case "outbox failed retry":
		if err := admin.RetrySetAside(ctx, pool, id, c.note); err != nil {
			return fmt.Errorf("outbox row %d: %w", id, err)
		}
		fmt.Fprintf(stdout, "outbox row %d: the relay tries it again at its next poll (relay outbox failed list shows the outcome)\n", id)
	case "outbox failed skip":
		if err := admin.SkipSetAside(ctx, pool, id, c.note); err != nil {
			return fmt.Errorf("outbox row %d: %w", id, err)
		}
		s, err := admin.GetSetAside(ctx, pool, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "outbox row %d skipped: event %s (source %s, seq %d) is never published; consumers give the gap at seq %d up at their gap timeout\n",
			id, s.EventID, s.Source, s.Seq, s.Seq)
		// The stream's producer is this database's identity (the records'
		// producer header); without one yet, the hint names the stream
		// without it.
		stream := ""
		if idn, err := admin.ReadIdentity(ctx, pool); err == nil && idn.ID != "" {
			stream = fmt.Sprintf(" -producer %s -topic %s", idn.ID, s.Topic)
		}
		fmt.Fprintf(stdout, "to close it now, run against each consumer's database: consumer gaps give-up %s %d-%d%s -note %q\n",
			s.Source, s.Seq, s.Seq, stream, "outbox row "+strconv.FormatInt(id, 10)+" skipped at the producer")
	}
	return nil
}

func identityShow(ctx context.Context, db dbtx.DB, c adminConfig, w io.Writer) error {
	idn, err := admin.ReadIdentity(ctx, db)
	if err != nil {
		return err
	}
	here, err := admin.CurrentPlace(ctx, db)
	if err != nil {
		return err
	}
	ts := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	txn := c.txnPrefix + c.shard
	if c.txnPrefix == "" {
		txn = relay.DefaultTransactionalID(idn.ID, c.shard)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "identity\t%s\n", idn.ID)
	fmt.Fprintf(tw, "created\t%s\n", idn.CreatedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "belongs to\t%s\n", idn.Place)
	fmt.Fprintf(tw, "this database\t%s\n", here)
	fmt.Fprintf(tw, "first used\t%s\n", ts(idn.FirstUsedAt))
	if idn.ChangedAt != nil {
		fmt.Fprintf(tw, "last change\t%s by %s: %s\n", ts(idn.ChangedAt), idn.ChangedBy, idn.ChangeNote)
	}
	fmt.Fprintf(tw, "transactional.id (shard %s)\t%s\n", c.shard, txn)
	fmt.Fprintf(tw, "checkpoint key (shard %s)\t%s\n", c.shard, relay.CheckpointKey(idn.ID, c.shard))
	legacy, err := admin.ListLegacyCheckpoints(ctx, db)
	if err != nil {
		return err
	}
	for _, l := range legacy {
		state := "unsettled"
		if l.SettledAt != nil {
			state = "settled " + ts(l.SettledAt) + ": " + l.Outcome
		} else if l.Decision != "" {
			state = "unsettled, decision " + l.Decision + " by " + l.DecidedBy
		}
		if l.Note != "" {
			state += " (note: " + l.Note + ")"
		}
		fmt.Fprintf(tw, "legacy checkpoint (shard %s)\t%s\n", l.Shard, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !idn.Place.Same(here) {
		fmt.Fprintln(w, "\nThis database is not where its identity belongs: the relay refuses to publish until `relay identity adopt` or `relay identity reset` (docs/relay.md, \"Restored or copied databases\").")
	}
	return nil
}

func failedList(ctx context.Context, db dbtx.DB, all bool, w io.Writer) error {
	rows, err := admin.ListSetAside(ctx, db, all)
	if err != nil {
		return err
	}
	ts := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSOURCE\tSEQ\tTOPIC\tREASON\tATTEMPTS\tSET ASIDE\tRETRY AT\tHELD ROWS\tSTATE\tERROR")
	for _, s := range rows {
		state := "open"
		if s.ResolvedAt != nil {
			state = s.Resolution + " " + ts(s.ResolvedAt)
			if s.Note != "" {
				state += " (" + oneLine(s.Note) + ")"
			}
		}
		retry := ts(s.RetryAt)
		if s.RetryAt == nil && s.ResolvedAt == nil {
			retry = "operator"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", s.OutboxID, s.Source, s.Seq, s.Topic, s.Reason,
			s.Attempts, s.SetAsideAt.UTC().Format(time.RFC3339), retry, s.HeldRows, state, oneLine(s.Error))
	}
	return tw.Flush()
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}
