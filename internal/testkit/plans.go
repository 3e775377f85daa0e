package testkit

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Plan is the root node of an EXPLAIN (ANALYZE, FORMAT JSON) plan.
type Plan map[string]any

// ExplainAnalyze runs EXPLAIN (ANALYZE, FORMAT JSON) of q with args in a
// transaction it rolls back, and returns the plan's root node.
func ExplainAnalyze(tb testing.TB, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}, q string, args ...any) Plan {
	tb.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []map[string]any
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+q, args...).Scan(&plan); err != nil {
		tb.Fatalf("explain: %v", err)
	}
	if len(plan) == 0 {
		tb.Fatal("explain returned no plan")
	}
	root, _ := plan[0]["Plan"].(map[string]any)
	return root
}

// RowsRead runs q as ExplainAnalyze does and returns how many rows the
// plan's scans of relations whose name starts with relPrefix read:
// returned or removed by a filter or an index recheck, over all their
// loops. EXPLAIN shows each loop's average, rounded, so the sum can be
// short by less than one row per loop; a scan that reads a whole table in
// one loop shows in full.
func RowsRead(tb testing.TB, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}, relPrefix, q string, args ...any) float64 {
	tb.Helper()
	var n float64
	ExplainAnalyze(tb, conn, q, args...).walk(func(node map[string]any) {
		if rel, _ := node["Relation Name"].(string); rel != "" && strings.HasPrefix(rel, relPrefix) {
			rows, _ := node["Actual Rows"].(float64)
			filtered, _ := node["Rows Removed by Filter"].(float64)
			rechecked, _ := node["Rows Removed by Index Recheck"].(float64)
			loops, _ := node["Actual Loops"].(float64)
			n += (rows + filtered + rechecked) * loops
		}
	})
	return n
}

// Relations are the relations the plan's scans read (at least one loop
// run: a node pruned at start or never executed is not one).
func (p Plan) Relations() map[string]bool {
	out := map[string]bool{}
	p.walk(func(node map[string]any) {
		if rel, _ := node["Relation Name"].(string); rel != "" {
			if loops, _ := node["Actual Loops"].(float64); loops > 0 {
				out[rel] = true
			}
		}
	})
	return out
}

func (p Plan) walk(f func(map[string]any)) {
	f(p)
	kids, _ := p["Plans"].([]any)
	for _, k := range kids {
		if m, ok := k.(map[string]any); ok {
			Plan(m).walk(f)
		}
	}
}
