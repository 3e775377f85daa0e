package migrate

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/pgconn"
	pkgmigrate "github.com/onceflow/onceflow/pkg/migrate"
)

// Command is the `migrate` subcommand shared by both binaries:
//
//	relay migrate [-database-url URL] [-to N | -status]
//
// It applies the embedded migrations under the advisory lock and prints the
// version it moved from and to.
func Command(ctx context.Context, prog string, args []string, stdout io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet(prog+" migrate", flag.ContinueOnError)
	var db pgconn.Config
	db.RegisterFlags(fs)
	to := fs.Int("to", -1, "target version (default: the newest); lower than the current version migrates down")
	status := fs.Bool("status", false, "print the database's schema version and how many migrations it lacks; change nothing")
	cli.Local(fs, "to", "status") // per-run choices: a deployment's environment never picks them
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
	return nil
}
