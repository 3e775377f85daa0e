// Command consumer applies events from Kafka topics to PostgreSQL exactly
// once through the onceflow inbox.
//
//	consumer run      consume with the handlers of -handlers-file
//	consumer migrate  apply the database migrations
//	consumer dlq list             list dead-lettered and held events (filters, -group-by error)
//	consumer dlq replay EVENT-ID  re-drive one through the handlers, once
//	consumer dlq replay -error-group ID -note "…"  re-drive a filtered set (-dry-run first)
//	consumer gaps list            open and recently given-up sequence gaps
//	consumer gaps give-up SOURCE FROM-TO -note "…" [-producer P -topic T]  give an open gap up now
//	consumer gaps resolve SOURCE FROM-TO -note "…" [-producer P -topic T]  record what was done
//	consumer reconcile -group G -topics T [-since 1h]  check a window end to end (read-only)
//	consumer effects held         effects held for an operator (a retry after the downstream's window)
//	consumer effects resolve KEY -scope S -note "…" [-code N -result JSON]  record what the downstream did
//	consumer effects unhold KEY -scope S -note "…"  let a held effect send
//
// `consumer run -admin` also serves the console (admin API and web page,
// docs/console.md).
//
// Every setting has an ONCEFLOW_* environment fallback (see -help of each
// command and docs/consumer.md); the per-invocation choices of the operator
// commands (-note, -since, -limit, -all, -actor, the dlq filters, …) are
// flags only. Invalid usage or configuration exits with status 2, a failure
// at run time with 1 (cli.ExitCode).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/onceflow/onceflow/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return
	}
	fmt.Fprintln(os.Stderr, "consumer:", err)
	os.Exit(cli.ExitCode(err))
}

const help = `usage: consumer <command> [flags]

commands:
  run                     consume and apply events
  migrate                 apply database migrations (-status: the version only; -validate-id-time:
                          check the inbox rows written before migration 036, see docs/consumer.md)
  check -handlers-file F  prepare the handler file's sql statements against
                          the database (nothing runs); run does it at start too
  prune                   delete expired inbox, effects and published outbox
                          rows per the retention file (for a CronJob)
  dlq list                list dead-lettered and held events; filters
                          (-event-type, -source, -error, -from/-to/-since,
                          -error-group, -status) and -group-by error
  dlq replay EVENT-ID     re-drive one event through the handlers
  dlq replay FILTER -note "…"
                          re-drive the matching events, per source in seq
                          order (-dry-run: count first; -all: everything)
  gaps list               list open sequence gaps and recently given-up ones
                          (-all: every given-up gap; -since 24h)
  gaps give-up SOURCE FROM-TO -note "…" [-producer P -topic T]
                          give an open gap up now instead of at its deadline
                          (the missing events will not come); the running
                          consumer releases the events parked behind it
  gaps resolve SOURCE FROM-TO -note "…" [-producer P -topic T]
                          record what was done about a given-up gap
  effects held            list effects held for an operator: a retry came
                          after the downstream's idempotency window
                          (-scope-prefix, -limit)
  effects resolve KEY -scope S -note "…" [-code N -result JSON]
                          record what the downstream did for a held effect:
                          later claims replay it, nothing is sent
  effects unhold KEY -scope S -note "…"
                          let a held effect send (its window restarts)

Tracing: the standard OpenTelemetry variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...); off when none is set. See docs/tracing.md.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, help)
		return cli.Usagef("a command is required")
	}
	switch args[0] {
	case "run":
		return runConsumer(ctx, args[1:], stderr)
	case "migrate":
		return runMigrate(ctx, args[1:], stdout, stderr)
	case "check":
		return runCheck(ctx, args[1:], stdout, stderr)
	case "prune":
		return runPrune(ctx, args[1:], stdout, stderr)
	case "dlq":
		if len(args) < 2 {
			return cli.Usagef("dlq: want list or replay")
		}
		switch args[1] {
		case "list":
			return runDLQList(ctx, args[2:], stdout, stderr)
		case "replay":
			return runDLQReplay(ctx, args[2:], stdout, stderr)
		}
		return cli.Usagef("dlq: unknown command %q (want list or replay)", args[1])
	case "gaps":
		if len(args) < 2 {
			return cli.Usagef("gaps: want list, give-up or resolve")
		}
		switch args[1] {
		case "list":
			return runGapsList(ctx, args[2:], stdout, stderr)
		case "give-up":
			return runGapsGiveUp(ctx, args[2:], stdout, stderr)
		case "resolve":
			return runGapsResolve(ctx, args[2:], stdout, stderr)
		}
		return cli.Usagef("gaps: unknown command %q (want list, give-up or resolve)", args[1])
	case "effects":
		if len(args) < 2 {
			return cli.Usagef("effects: want held, resolve or unhold")
		}
		switch args[1] {
		case "held":
			return runEffectsHeld(ctx, args[2:], stdout, stderr)
		case "resolve":
			return runEffectsResolve(ctx, args[2:], stdout, stderr)
		case "unhold":
			return runEffectsUnhold(ctx, args[2:], stdout, stderr)
		}
		return cli.Usagef("effects: unknown command %q (want held, resolve or unhold)", args[1])
	case "reconcile":
		return runReconcile(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, help)
		return nil
	}
	fmt.Fprint(stderr, help)
	return cli.Usagef("unknown command %q", args[0])
}
