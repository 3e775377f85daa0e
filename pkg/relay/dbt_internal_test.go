package relay

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// quietHousekeeper is a housekeeper on cfg with metrics of its own and no
// log output.
func quietHousekeeper(t testing.TB, cfg Config) *housekeeper {
	t.Helper()
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return &housekeeper{cfg: cfg, log: slog.New(slog.NewTextHandler(io.Discard, nil)), m: m}
}

// dbT runs a test's statements on pool, failing the test on an error.
type dbT struct {
	t    testing.TB
	pool *pgxpool.Pool
}

// exec runs q.
func (d dbT) exec(q string, args ...any) {
	d.t.Helper()
	if _, err := d.pool.Exec(context.Background(), q, args...); err != nil {
		d.t.Fatalf("%s: %v", q, err)
	}
}

// one returns q's one integer.
func (d dbT) one(q string, args ...any) int64 {
	d.t.Helper()
	var n int64
	if err := d.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		d.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// insert writes n outbox rows of source (topic t) and returns their ids.
func (d dbT) insert(n int, source string) []int64 {
	d.t.Helper()
	rows, err := d.pool.Query(context.Background(), `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload)
		SELECT gen_random_uuid()::text, 't', $2, 'e', '{}' FROM generate_series(1, $1) RETURNING id`, n, source)
	if err != nil {
		d.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		d.t.Fatal(err)
	}
	return ids
}
