package seqguard

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
)

// The lock statement never searches the batch's sources linearly for every
// seq_state row. A prepared statement runs a generic plan after a few
// executions; there "source = ANY($2)" over a sequential scan compares each
// row with each source of the batch (10× the cost of the lock at 1000
// sources, the largest statement of a consumer batch). The plan is taken
// generic on purpose, on a table small enough for a sequential scan.
func TestLockStatePlanHasNoLinearSearch(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO onceflow.seq_state (consumer, source, last_applied)
		SELECT 'c', 'src-' || g, 1 FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE onceflow.seq_state`); err != nil {
		t.Fatal(err)
	}
	srcs := make([]string, 250)
	for i := range srcs {
		srcs[i] = fmt.Sprintf("src-%d", 4*i+1)
	}
	var plan strings.Builder
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		for _, q := range []string{
			`SET LOCAL plan_cache_mode = force_generic_plan`,
			`PREPARE lock_state(text, text[]) AS ` + qLockState,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		// EXECUTE takes no parameters: the batch's sources as a literal.
		rows, err := tx.Query(ctx, `EXPLAIN EXECUTE lock_state('c', '{`+strings.Join(srcs, ",")+`}')`)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		plan.WriteString(strings.Join(lines, "\n"))
		_, err = tx.Exec(ctx, `DEALLOCATE lock_state`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if p := plan.String(); strings.Contains(p, "ANY (") || !strings.Contains(p, "LockRows") {
		t.Errorf("the generic plan of the lock searches the sources linearly (or locks nothing):\n%s", p)
	}
}
