package migrate

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/pgconn"
	pkgmigrate "github.com/onceflow/onceflow/pkg/migrate"
)

// Command is the `migrate` subcommand shared by both binaries:
//
//	relay migrate [-database-url URL] [-to N | -status] [-validate-id-time]
//
// It applies the embedded migrations under the advisory lock and prints the
// version it moved from and to.
func Command(ctx context.Context, prog string, args []string, stdout io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet(prog+" migrate", flag.ContinueOnError)
	var db pgconn.Config
	db.RegisterFlags(fs)
	to := fs.Int("to", -1, "target version (default: the newest); lower than the current version migrates down")
	status := fs.Bool("status", false, "print the database's schema version and how many migrations it lacks; change nothing")
	idTime := fs.Bool("validate-id-time", false, "after migrating, check the inbox rows written before migration 036 against its constraint inbox_id_time and, when all hold, let the dedup probe skip old buckets for them (see docs/consumer.md)")
	cli.Local(fs, "to", "status", "validate-id-time") // per-run choices: a deployment's environment never picks them
	if err := cli.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "usage: %s migrate [flags]\n", prog)
			cli.Usage(fs, stdout)
			return err
		}
		return &cli.UsageError{Err: err}
	}
	if err := db.Validate(); err != nil {
		return &cli.UsageError{Err: err}
	}
	if *status && *idTime {
		return cli.Usagef("-validate-id-time changes the database: not with -status")
	}
	conn, err := db.Conn(ctx, "onceflow-"+prog+"-migrate")
	if err != nil {
		return fmt.Errorf("connect to database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if *status {
		st, err := pkgmigrate.Status(ctx, conn)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "schema onceflow at version %d; this build's newest is %d (%d pending)\n", st.Current, st.Latest, st.Pending())
		return nil
	}
	from, now, err := To(ctx, conn, int32(*to))
	if err != nil {
		return err
	}
	log.InfoContext(ctx, "migrated", slog.Int("from_version", int(from)), slog.Int("to_version", int(now)))
	fmt.Fprintf(stdout, "schema onceflow at version %d (was %d)\n", now, from)
	if *idTime {
		return validateIDTime(ctx, conn, stdout, log)
	}
	return nil
}

// validateIDTime is -validate-id-time: pkgmigrate.ValidateIDTime, its
// outcome printed; an error when rows break the constraint.
func validateIDTime(ctx context.Context, conn *pgx.Conn, stdout io.Writer, log *slog.Logger) error {
	rep, err := pkgmigrate.ValidateIDTime(ctx, conn)
	fmt.Fprintf(stdout, "inbox_id_time: %d partitions checked now\n", len(rep.Validated))
	if err != nil {
		return err
	}
	for _, b := range rep.Broken {
		fmt.Fprintf(stdout, "inbox_id_time: %s holds %d rows that break it (event_at %s to %s)\n",
			b.Name, b.Rows, b.Oldest.UTC().Format(time.RFC3339), b.Newest.UTC().Format(time.RFC3339))
	}
	if !rep.Done {
		return fmt.Errorf("inbox_id_time: %d partitions hold rows written before migration 036 whose UUIDv7 ids run more than an hour ahead of their event_at; onceflow.inbox_id_time.since is unchanged (the probe keeps reading every bucket older than it); run again once retention has removed them", len(rep.Broken))
	}
	log.InfoContext(ctx, "inbox_id_time validated", slog.Int("partitions", len(rep.Validated)))
	fmt.Fprintln(stdout, "inbox_id_time: every inbox row holds to it; onceflow.inbox_id_time.since = -infinity (restart consumers to skip old buckets)")
	return nil
}
