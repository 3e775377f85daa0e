package relay

import (
	"context"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
)

// The shard statements walk their index in order and stop at the limit,
// like the unsharded ones, instead of sorting the whole backlog: the plan
// is what makes a sharded poll cost about N rows per row published rather
// than the whole table (see qSelectBatchShard).
func TestShardStatementsWalkTheirIndex(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	// A backlog as the benchmark's: the bad plan only wins on a table of
	// realistic size.
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, payload)
		SELECT 'ev-' || g, 't', 'src-' || (g % 256), g / 256 + 1, 'e', 'application/octet-stream', decode(repeat('ab', 256), 'hex')
		  FROM generate_series(0, 99999) g`); err != nil {
		t.Fatal(err)
	}
	var halfIDs []int64
	if err := db.Pool.QueryRow(ctx, `SELECT array_agg(id) FROM (SELECT id FROM onceflow.outbox ORDER BY id LIMIT 50000) h`).Scan(&halfIDs); err != nil {
		t.Fatal(err)
	}
	analyze := func() {
		if _, err := db.Pool.Exec(ctx, `ANALYZE onceflow.outbox, onceflow.outbox_pending`); err != nil {
			t.Fatal(err)
		}
	}
	plan := func(q string, args ...any) string {
		rows, err := db.Pool.Query(ctx, "EXPLAIN "+q, args...)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				t.Fatal(err)
			}
			b.WriteString(l + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	for _, tt := range []struct {
		name, q, index string
		args           []any
		before         string
	}{
		{"poll", qSelectBatch, "outbox_pending_pkey", []any{1000, []int64{}, 4 << 20, 0}, ""},
		{"poll, sharded", qSelectBatchShard, "outbox_pending_pkey", []any{1000, []int64{}, 4 << 20, 0, 4, 1}, ""},
		// The older half published (kept for the retention) and analyzed.
		{"poll after a drain", qSelectBatch, "outbox_pending_pkey", []any{1000, []int64{}, 4 << 20, 0}, qMarkPublished},
		{"poll after a drain, sharded", qSelectBatchShard, "outbox_pending_pkey", []any{1000, []int64{}, 4 << 20, 0, 4, 1},
			qMarkPublished},
	} {
		if tt.before != "" {
			if _, err := db.Pool.Exec(ctx, tt.before, halfIDs); err != nil {
				t.Fatal(err)
			}
		}
		analyze()
		p := plan(tt.q, tt.args...)
		// The outbox is only probed by key, never walked (a merge join
		// would walk it from its first, long published, row).
		if !strings.Contains(p, "Scan using "+tt.index) || strings.Contains(p, "Sort") ||
			strings.Contains(p, "Merge Join") || strings.Contains(p, "Seq Scan on outbox ") {
			t.Errorf("%s: the plan does not walk %s:\n%s", tt.name, tt.index, p)
		}
	}
}
