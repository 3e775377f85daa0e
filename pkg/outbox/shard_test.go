package outbox_test

import (
	"fmt"
	"testing"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// The hash is part of the deployment contract: a source must stay in its
// shard across versions (and in SQL). These values are MD5's, computed
// independently of the Go code.
func TestSourceShardIsStable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		source string
		shards int
		want   int
	}{
		{"order-7", 1, 0}, {"order-7", 2, 0}, {"order-7", 3, 2}, {"order-7", 4, 2},
		{"a", 2, 1}, {"a", 3, 0}, {"a", 4, 1},
		{"", 2, 1}, {"", 4, 1},
		{"thread/42", 2, 0}, {"thread/42", 4, 2},
		{"naïve-источник", 2, 1}, {"naïve-источник", 4, 3},
		{"anything", 0, 0}, {"anything", -3, 0},
	}
	for _, tt := range tests {
		if got := outbox.SourceShard(tt.source, tt.shards); got != tt.want {
			t.Errorf("SourceShard(%q, %d) = %d, want %d", tt.source, tt.shards, got, tt.want)
		}
	}
}

// Every shard gets a fair part of many sources, and each source exactly one
// shard.
func TestSourceShardSpreads(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3, 4, 7} {
		counts := make([]int, n)
		const sources = 20000
		for i := range sources {
			k := outbox.SourceShard(fmt.Sprintf("customer-%d", i), n)
			if k < 0 || k >= n {
				t.Fatalf("SourceShard(…, %d) = %d", n, k)
			}
			counts[k]++
		}
		for k, c := range counts {
			if want := sources / n; c < want*9/10 || c > want*11/10 {
				t.Errorf("%d shards: shard %d has %d of %d sources (want about %d)", n, k, c, sources, want)
			}
		}
	}
}

// onceflow.source_shard, which the relay filters its reads with, is
// SourceShard.
func TestSourceShardSQLMatchesGo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sources := []string{"", "a", "order-7", "thread/42", "naïve-источник", "emoji-🙂", "with space", "x\ty"}
	for i := range 300 {
		sources = append(sources, fmt.Sprintf("src-%d-%x", i, i*7919))
	}
	for _, n := range []int{1, 2, 3, 4, 16} {
		rows, err := b.db.Pool.Query(b.ctx, `SELECT s, onceflow.source_shard(s, $2) FROM unnest($1::text[]) AS s`, sources, n)
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for rows.Next() {
			var s string
			var k int
			if err := rows.Scan(&s, &k); err != nil {
				t.Fatal(err)
			}
			if want := outbox.SourceShard(s, n); k != want {
				t.Errorf("onceflow.source_shard(%q, %d) = %d, SourceShard = %d", s, n, k, want)
			}
			seen++
		}
		if err := rows.Err(); err != nil || seen != len(sources) {
			t.Fatalf("read %d of %d: %v", seen, len(sources), err)
		}
	}
}
