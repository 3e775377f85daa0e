package relay_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/relay"
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
		if got := relay.SourceShard(tt.source, tt.shards); got != tt.want {
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
			k := relay.SourceShard(fmt.Sprintf("customer-%d", i), n)
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
			if want := relay.SourceShard(s, n); k != want {
				t.Errorf("onceflow.source_shard(%q, %d) = %d, SourceShard = %d", s, n, k, want)
			}
			seen++
		}
		if err := rows.Err(); err != nil || seen != len(sources) {
			t.Fatalf("read %d of %d: %v", seen, len(sources), err)
		}
	}
}

// On a database whose encoding is not UTF-8, onceflow.source_shard hashes
// the source's bytes in that encoding and SourceShard its UTF-8 bytes, so
// for a non-ASCII source the two disagree (whether they agree otherwise
// depends on each client's client_encoding): a relay with Shards > 1
// refuses to start there, naming the encoding.
func TestSourceShardNonUTF8DatabaseRefused(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, testkit.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("t_latin1_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s WITH ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'", name)); err != nil {
		t.Fatalf("the cluster does not allow a LATIN1 database: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), testkit.DatabaseURL(t))
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			c.Close(context.Background())
		}
	})
	url := testkit.WithDatabase(testkit.DatabaseURL(t), name)
	// A client whose text is UTF-8 (psql in a UTF-8 terminal, most
	// drivers' settings): the server stores "é" as one LATIN1 byte.
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cc.RuntimeParams["client_encoding"] = "UTF8"
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// The migrations do not all apply to a LATIN1 database (some hold
	// characters it cannot store); the shard function does, as migration
	// 011 defines it.
	up, err := fs.ReadFile(migrations.FS, "011_relay_shards.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	fn := string(up)[strings.Index(string(up), "CREATE FUNCTION"):]
	fn = fn[:strings.Index(fn, "$fn$;")+len("$fn$;")]
	if _, err := conn.Exec(ctx, "CREATE SCHEMA onceflow; "+fn); err != nil {
		t.Fatal(err)
	}
	const source = "café-naïve"
	var sqlShard int
	for n := 2; ; n++ {
		if err := conn.QueryRow(ctx, `SELECT onceflow.source_shard($1, $2)`, source, n).Scan(&sqlShard); err != nil {
			t.Fatal(err)
		}
		if sqlShard != relay.SourceShard(source, n) {
			t.Logf("LATIN1: onceflow.source_shard(%q, %d) = %d, SourceShard = %d", source, n, sqlShard, relay.SourceShard(source, n))
			break
		}
		if n > 64 {
			t.Fatal("SQL and Go agree on every shard count: the test source hashes alike")
		}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := relay.New(relay.Config{DB: pool, Shards: 2, Shard: "0",
		KafkaOpts: []kgo.Opt{kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(t), ",")...)}})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(ctx)
	var ce *relay.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "LATIN1") {
		t.Fatalf("Run on a LATIN1 database with 2 shards: %v, want a ConfigError naming the encoding", err)
	}
	t.Logf("refused: %v", err)
}
