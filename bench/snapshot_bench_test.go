package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// BenchmarkHeldSnapshot: the consumer's drain with a REPEATABLE READ
// snapshot held in its database from before the first event to after the
// last, beside the same drain without one (issue 34: every database has an
// idle-in-transaction session or a long report some day, and vacuum cannot
// remove what the consumer's updates leave behind while it lasts).
func BenchmarkHeldSnapshot(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	consumerHeldSnapshot(b, benchReport, sz.SnapshotEvents)
}

// BenchmarkRelayHeldSnapshot: the relay's drain of a backlog with a
// REPEATABLE READ snapshot held from before the first row was written to
// after the last was published, beside the same drain without one (issue
// 34 item 1). Without the relay's scan floor each poll walked every queue
// entry published since the snapshot began (0.33 of the plain drain at 1M
// rows).
func BenchmarkRelayHeldSnapshot(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	relayHeldSnapshot(b, benchReport, sz.SnapshotRelayRows)
}

// relayHeldSnapshot drains a backlog of n rows into Kafka from a fresh
// database, then the same backlog from another fresh database in which a
// snapshot is taken before the backlog is written and held until the drain
// is over.
func relayHeldSnapshot(tb testing.TB, rep *report, n int) {
	ctx := context.Background()
	run := func(held bool) (float64, time.Duration) {
		db := testkit.NewDB(tb)
		topic := testkit.Topic(tb, "bench-relay-snapshot", 4, nil)
		if held {
			release := holdSnapshot(tb, db.URL)
			defer release()
		}
		if _, err := db.Pool.Exec(ctx, `
			INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, payload)
			SELECT 'ev-' || g, $1, 'src-' || (g % 256), g / 256 + 1, 'bench.event', 'application/octet-stream',
			       decode(repeat('ab', $3), 'hex')
			  FROM generate_series(0, $2 - 1) g`, topic, n, relayBenchPayload); err != nil {
			tb.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE onceflow.outbox, onceflow.outbox_pending`); err != nil {
			tb.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		t0 := time.Now()
		stop := startBenchRelay(tb, db, relayBenchBatch, false, false, reg)
		defer stop()
		waitCounter(tb, reg, "onceflow_relay_published_total", 0, float64(n), 30*time.Minute)
		waitMarked(tb, db, topic)
		d := time.Since(t0)
		return float64(n) / d.Seconds(), d
	}
	record := rep.measure()
	plain, plainD := run(false)
	record(figure{Name: "relay drain, no snapshot held", Value: plain, Unit: "events/s",
		Notes: []string{fmt.Sprintf("%d rows of %d B in %s", n, relayBenchPayload, plainD.Round(time.Millisecond))}})
	record = rep.measure()
	held, heldD := run(true)
	ratio := held / plain
	record(figure{Name: "held snapshot: relay drain, a REPEATABLE READ snapshot held from before the first row to after the last", Value: held, Unit: "events/s",
		CeilingName: "no snapshot held", Ceiling: plain, Target: "ratio >= 0.8", Met: met(ratio >= 0.8),
		Notes: []string{fmt.Sprintf("%d rows in %s; ratio %.2f", n, heldD.Round(time.Millisecond), ratio)}})
	tb.Logf("relay drain of %d rows: %.0f events/s plain, %.0f with a snapshot held; ratio %.2f", n, plain, held, ratio)
}

// holdSnapshot opens a REPEATABLE READ transaction on its own connection
// to url and takes its snapshot; release ends it. While it is open, no
// row version deleted or updated after it began can be removed in that
// database.
func holdSnapshot(tb testing.TB, url string) (release func()) {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatal(err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		tb.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM onceflow.consumer_offsets`).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return func() {
		_ = tx.Rollback(ctx)
		_ = conn.Close(ctx)
	}
}

// insertBatch is a handler that only inserts (one row per event, one
// statement per batch). A handler that updates one row per source for every
// event (sqlUpsertHandler) slows down under a held snapshot by itself, for
// the reason the guard's state moved to seq_applied: this figure measures
// onceflow's part.
type insertBatch struct{}

func (insertBatch) HandleBatch(ctx context.Context, tx pgx.Tx, evs []inbox.Event) error {
	ids, srcs, seqs := make([]string, len(evs)), make([]string, len(evs)), make([]int64, len(evs))
	for i, ev := range evs {
		ids[i], srcs[i], seqs[i] = ev.EventID, ev.Source, ev.Seq
	}
	_, err := tx.Exec(ctx, `INSERT INTO public.bench_events (event_id, source, seq) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`, ids, srcs, seqs)
	return err
}

// consumerHeldSnapshot drains n events into a fresh database, then the same
// events (a new topic's copy would differ in layout; a new database keeps
// it identical) into another fresh database with a snapshot held there.
func consumerHeldSnapshot(tb testing.TB, rep *report, n int) {
	ctx := context.Background()
	topic := testkit.Topic(tb, "bench-snapshot", benchPartitions, nil)
	prefill(tb, topic, n)
	run := func(held bool) (float64, string) {
		db := testkit.NewDB(tb)
		if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.bench_events (event_id text PRIMARY KEY, source text NOT NULL, seq bigint NOT NULL)`); err != nil {
			tb.Fatal(err)
		}
		name := "plain"
		if held {
			name = "held"
			release := holdSnapshot(tb, db.URL)
			defer release()
		}
		cpu := startCPU(tb, db.Pool)
		d, _ := drain(tb, db.Pool, topic, name, insertBatch{}, "onceflow_consumer_processed_total", n)
		return float64(n) / d.Seconds(), cpu(n)
	}
	record := rep.measure()
	plain, plainCPU := run(false)
	record(figure{Name: "consumer drain, no snapshot held", Value: plain, Unit: "events/s", Notes: []string{fmt.Sprintf("%d events, a Go handler inserting one row per event", n), plainCPU}})
	record = rep.measure()
	t0 := time.Now()
	held, heldCPU := run(true)
	ratio := held / plain
	record(figure{Name: "held snapshot: consumer drain, a REPEATABLE READ snapshot held throughout", Value: held, Unit: "events/s",
		CeilingName: "no snapshot held", Ceiling: plain, Target: "ratio >= 0.8", Met: met(ratio >= 0.8),
		Notes: []string{fmt.Sprintf("%d events in %s", n, time.Since(t0).Round(time.Millisecond)), heldCPU}})
}
