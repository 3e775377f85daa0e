package handlerfile

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/inbox"
)

// Beginner is what Check needs of a PostgreSQL handle: *pgxpool.Pool and
// *pgx.Conn have it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// CheckError lists the handlers whose sql statement the database refused
// (a missing table or column, a type mismatch, a syntax error, no
// privilege): every event of their types would be dead-lettered.
type CheckError struct {
	Problems []string
}

func (e *CheckError) Error() string {
	return fmt.Sprintf("%d sql handler(s) the database refuses: %s", len(e.Problems), strings.Join(e.Problems, "; "))
}

// CheckResult says what Check looked at.
type CheckResult struct {
	Handlers   int // handlers in the file
	Statements int // sql statements prepared
}

// Check prepares every sql handler's statement against db, as the role and
// with the search_path the consumer will use, inside a transaction it rolls
// back: nothing runs and nothing is written. A statement the database
// refuses is reported in a *CheckError naming its event type and
// PostgreSQL's message; any other error (the database not reachable) is
// returned as it is. Handlers that are not a handler file's pass.
func Check(ctx context.Context, h inbox.BatchHandler, db Beginner) (CheckResult, error) {
	c, ok := h.(*configured)
	if !ok {
		return CheckResult{}, nil
	}
	res := CheckResult{Handlers: len(c.byType)}
	types := make([]string, 0, len(c.byType))
	for t, comp := range c.byType {
		if comp.stmt != nil {
			types = append(types, t)
		}
	}
	sort.Strings(types)
	if len(types) == 0 {
		return res, nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("check handlers: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var problems []string
	for _, t := range types {
		// A savepoint per statement: a refused one aborts only itself.
		sp, err := tx.Begin(ctx)
		if err != nil {
			return res, fmt.Errorf("check handlers: %w", err)
		}
		// The unnamed statement: parsed and analysed, never run, nothing left behind.
		_, err = sp.Conn().PgConn().Prepare(ctx, "", c.byType[t].stmt.sql, nil)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr):
			msg := fmt.Sprintf("event_type %q: %s (SQLSTATE %s)", t, pgErr.Message, pgErr.Code)
			if pgErr.Hint != "" {
				msg += "; hint: " + pgErr.Hint
			}
			problems = append(problems, msg)
		case err != nil:
			return res, fmt.Errorf("check handler for %q: %w", t, err)
		default:
			res.Statements++
		}
		if err := sp.Rollback(ctx); err != nil {
			return res, fmt.Errorf("check handlers: %w", err)
		}
	}
	if len(problems) > 0 {
		return res, &CheckError{Problems: problems}
	}
	return res, nil
}
