package testkit

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// RowsRead runs EXPLAIN (ANALYZE, FORMAT JSON) of q with args in a
// transaction it rolls back, and returns how many rows the plan's scans of
// relations whose name starts with relPrefix read: returned or removed by a
// filter or an index recheck, over all their loops. EXPLAIN shows each
// loop's average, rounded, so the sum can be short by less than one row per
// loop; a scan that reads a whole table in one loop shows in full.
func RowsRead(tb testing.TB, conn interface {
	Begin(context.Context) (pgx.Tx, error)
}, relPrefix, q string, args ...any) float64 {
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
	return rowsRead(root, relPrefix)
}

func rowsRead(node map[string]any, prefix string) float64 {
	var n float64
	if rel, _ := node["Relation Name"].(string); rel != "" && strings.HasPrefix(rel, prefix) {
		rows, _ := node["Actual Rows"].(float64)
		filtered, _ := node["Rows Removed by Filter"].(float64)
		rechecked, _ := node["Rows Removed by Index Recheck"].(float64)
		loops, _ := node["Actual Loops"].(float64)
		n += (rows + filtered + rechecked) * loops
	}
	kids, _ := node["Plans"].([]any)
	for _, k := range kids {
		if m, ok := k.(map[string]any); ok {
			n += rowsRead(m, prefix)
		}
	}
	return n
}
