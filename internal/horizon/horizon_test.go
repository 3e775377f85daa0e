package horizon

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestCollectorSeesAHeldSnapshot: a REPEATABLE READ transaction that keeps
// its snapshot while others commit shows as the transaction holder, with
// its age in seconds and in transactions; once it ends the gauges fall to 0.
func TestCollectorSeesAHeldSnapshot(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	c := NewCollector(db.Pool, "relay", nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	quiet, err := Measure(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if a := quiet[Transaction]; a.Seconds > 5 {
		t.Fatalf("before the holder: transaction age %+v", a)
	}

	holder, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	if _, err := holder.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, "SELECT count(*) FROM onceflow.outbox"); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	// Time and transactions pass while the snapshot is held.
	if _, err := db.Pool.Exec(ctx, "SELECT pg_sleep(0.3)"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := db.Pool.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
			t.Fatal(err)
		}
	}
	held, err := Measure(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if a := held[Transaction]; a.Seconds < 0.3 || a.Xids < 5 {
		t.Fatalf("with a snapshot held: transaction age %+v, want ≥ 0.3 s and ≥ 5 xids", a)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := -1.0
	for _, mf := range mfs {
		if mf.GetName() != "onceflow_relay_cleanup_horizon_age_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == Transaction {
				got = m.GetGauge().GetValue()
			}
		}
	}
	if got < 0.3 {
		t.Fatalf("gathered onceflow_relay_cleanup_horizon_age_seconds{holder=\"transaction\"} = %v, want ≥ 0.3", got)
	}

	if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	after, err := Measure(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if a := after[Transaction]; a.Seconds >= held[Transaction].Seconds {
		t.Fatalf("after the holder ended: transaction age %+v (held: %+v)", a, held[Transaction])
	}
}

// TestCollectorCountsFailures: a database that does not answer is a counted
// failure, not a zero.
func TestCollectorCountsFailures(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: dials a closed port")
	}
	conn, err := pgx.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	c := NewCollector(dialer{conn}, "consumer", nil)
	n := testutil.CollectAndCount(c)
	if n != 1 { // only the error counter
		t.Fatalf("collected %d metrics from a dead database, want only the error counter", n)
	}
	if v := testutil.ToFloat64(c.errors); v != 1 {
		t.Fatalf("errors_total = %v, want 1", v)
	}
}

// dialer connects for each query (and so fails like a dead database).
type dialer struct{ cfg *pgx.ConnConfig }

func (d dialer) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	conn, err := pgx.ConnectConfig(ctx, d.cfg)
	if err != nil {
		return nil, err
	}
	return conn.Query(ctx, sql, args...)
}
