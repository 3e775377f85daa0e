package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
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
			release := testkit.HoldSnapshot(tb, db.URL)
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

// BenchmarkProducerHeldSnapshot: producers enqueueing with a REPEATABLE
// READ snapshot held from before the first event to after the last, against
// the same enqueues without it. Each statement moves its streams' counters;
// as UPDATEs of one row per stream those moves left versions the snapshot
// kept, and every later lock walked them (about 900 enqueues/s fell to 50
// after 68k events on ten streams). The figure compares the last tenth of
// the events, where that walk is longest.
func BenchmarkProducerHeldSnapshot(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	producerHeldSnapshot(b, benchReport, sz.SnapshotProducerEvents)
}

// producerHeldSnapshot enqueues n events in transactions of one statement
// (outbox.EnqueueBatch) of 10 events on 10 streams, from 2 connections,
// into a fresh database, and again into another with a snapshot held there.
func producerHeldSnapshot(tb testing.TB, rep *report, n int) {
	ctx := context.Background()
	const streams, perTxn, writers = 10, 10, 2
	run := func(held bool) (all, last float64) {
		db := testkit.NewDB(tb)
		if held {
			release := testkit.HoldSnapshot(tb, db.URL)
			defer release()
		}
		payload := []byte(`{"pad":"` + strings.Repeat("x", 90) + `"}`)
		txns := max(1, n/perTxn/writers)
		tail := max(1, txns/10)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		var tailStart, end time.Time
		start := time.Now()
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range txns {
					if i == txns-tail {
						mu.Lock()
						if t := time.Now(); tailStart.IsZero() || t.Before(tailStart) {
							tailStart = t
						}
						mu.Unlock()
					}
					msgs := make([]outbox.Message, perTxn)
					for k := range msgs {
						msgs[k] = outbox.Message{Topic: "bench-producer", Source: "s" + strconv.Itoa(k%streams), EventType: "bench.event",
							EventID: fmt.Sprintf("w%d-%d-%d", w, i, k), Payload: payload}
					}
					if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
						_, err := outbox.EnqueueBatch(ctx, tx, msgs)
						return err
					}); err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = err
						}
						mu.Unlock()
						return
					}
				}
			}()
		}
		wg.Wait()
		end = time.Now()
		if firstErr != nil {
			tb.Fatal(firstErr)
		}
		total := txns * writers * perTxn
		return float64(total) / end.Sub(start).Seconds(), float64(tail*writers*perTxn) / end.Sub(tailStart).Seconds()
	}
	record := rep.measure()
	plainAll, plainLast := run(false)
	record(figure{Name: "producer enqueue, no snapshot held (last tenth)", Value: plainLast, Unit: "events/s",
		Notes: []string{fmt.Sprintf("%d events, EnqueueBatch of %d events on %d streams per transaction, %d connections; %.0f events/s over the whole run", n, perTxn, streams, writers, plainAll)}})
	record = rep.measure()
	heldAll, heldLast := run(true)
	ratio := heldLast / plainLast
	record(figure{Name: "held snapshot: producer enqueue, a REPEATABLE READ snapshot held throughout (last tenth)", Value: heldLast, Unit: "events/s",
		CeilingName: "no snapshot held", Ceiling: plainLast, Target: "ratio >= 0.8", Met: met(ratio >= 0.8),
		Notes: []string{fmt.Sprintf("%.0f events/s over the whole run", heldAll)}})
	tb.Logf("producer enqueue of %d events: last tenth %.0f events/s plain, %.0f with a snapshot held; ratio %.2f", n, plainLast, heldLast, ratio)
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
			release := testkit.HoldSnapshot(tb, db.URL)
			defer release()
		}
		cpu := startCPU(tb, db.Pool)
		d, _ := drain(tb, db.Pool, topic, name, insertBatch{}, "onceflow_consumer_processed_total", n)
		perEvent := cpu(n)
		return float64(n) / d.Seconds(), perEvent + "; " + bufferNote(tb, db.Pool, n)
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
	tb.Logf("consumer drain of %d events: %.0f events/s plain, %.0f with a snapshot held; ratio %.2f\nplain: %s\nheld: %s", n, plain, held, ratio, plainCPU, heldCPU)
}

// bufferNote names the tables (with their indexes) the drain read most
// buffers from, per event: where a held snapshot's cost lands. The pool's
// connections are closed first, so that their backends report what they
// read (a backend sends its counts when idle, at most once a second).
func bufferNote(tb testing.TB, pool *pgxpool.Pool, events int) string {
	tb.Helper()
	ctx := context.Background()
	pool.Reset()
	var self int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&self); err != nil {
		tb.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var others int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> $1 AND state IS DISTINCT FROM 'idle in transaction'`, self).Scan(&others); err != nil {
			tb.Fatal(err)
		}
		if others == 0 {
			break
		}
	}
	rows, err := pool.Query(ctx, `
SELECT t.schemaname || '.' || t.relname,
       coalesce(t.heap_blks_hit, 0) + coalesce(t.heap_blks_read, 0) + coalesce(t.idx_blks_hit, 0) + coalesce(t.idx_blks_read, 0)
FROM pg_statio_all_tables t
WHERE t.schemaname IN ('onceflow', 'public')
ORDER BY 2 DESC LIMIT 5`)
	if err != nil {
		tb.Fatal(err)
	}
	var parts []string
	for rows.Next() {
		var name string
		var blocks int64
		if err := rows.Scan(&name, &blocks); err != nil {
			tb.Fatal(err)
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", name, float64(blocks)/float64(events)))
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return "buffers per event (table and its indexes): " + strings.Join(parts, ", ")
}
