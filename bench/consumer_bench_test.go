package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
)

const (
	benchPartitions = 4
	benchSources    = 1000
	benchPayload    = 256
)

// BenchmarkConsumerDrain drains a pre-filled topic through the inbox with a
// one-row upsert handler (the sql handler, with the monotonic guard) and
// prints events/s beside a ceiling measured in the same run: the same event
// ids inserted into the same inbox table with raw batched
// INSERT … SELECT unnest(…) ON CONFLICT DO NOTHING, with the same
// parallelism and batch size and no Kafka and no handler. Then a second
// group with the same consumer name re-reads the topic: every record is a
// duplicate, and its speed is compared with the first delivery.
func BenchmarkConsumerDrain(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	consumerDrain(b, benchReport, sz.ConsumerEvents, sz.ConsumerFull)
}

// consumerDrain measures the raw consume and raw insert ceilings and the
// consumer's first delivery of n events, and with full the replays and the
// set-based handler; it records the figures in rep.
func consumerDrain(b testing.TB, rep *report, n int, full bool) {
	ctx := context.Background()
	db := testkit.NewDB(b)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.bench_state (source text PRIMARY KEY, seq bigint NOT NULL, n bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	topic := testkit.Topic(b, "bench-consumer", benchPartitions, nil)
	ids, perPartition := prefill(b, topic, n)
	consumeCeiling := rawConsumeCeiling(b, rep, topic, n)

	{
		// Ceiling: raw batched inbox inserts of the same ids.
		record := rep.measure()
		ceiling := rawInsertCeiling(b, db.Pool, perPartition, 500)
		record(figure{Name: "ceiling: raw batched inbox insert (unnest, ON CONFLICT DO NOTHING)", Value: float64(n) / ceiling.Seconds(), Unit: "events/s",
			Notes: []string{fmt.Sprintf("%d rows, %d goroutines, batches of 500", n, benchPartitions)}})
		truncate := func() {
			for _, q := range []string{`TRUNCATE onceflow.inbox, onceflow.consumer_offsets, public.bench_state`, `VACUUM ANALYZE onceflow.inbox`} {
				if _, err := db.Pool.Exec(ctx, q); err != nil {
					b.Fatal(err)
				}
			}
		}
		truncate()

		// Ceiling: the same database work as the consumer with the sql
		// handler, without Kafka or onceflow: per batch, one transaction
		// with the raw batched inbox insert and the handler's statement for
		// every row of the batch (pipelined).
		record = rep.measure()
		work := sameWorkCeiling(b, db.Pool, perPartition, 500)
		workRate := float64(n) / work.Seconds()
		record(figure{Name: "ceiling: inbox insert + sql handler statement, one txn per batch (no Kafka)", Value: workRate, Unit: "events/s",
			Notes: []string{fmt.Sprintf("%d rows, %d goroutines, batches of 500: BEGIN; INSERT … unnest … ON CONFLICT DO NOTHING; the handler's upsert per row (one pipeline); COMMIT", n, benchPartitions)}})
		truncate()

		h := sqlUpsertHandler(b)
		record = rep.measure()
		first, firstJoin := drain(b, db.Pool, topic, "first", h, "onceflow_consumer_processed_total", n)
		firstRate, ceilRate := float64(n)/first.Seconds(), float64(n)/ceiling.Seconds()
		lowest, lowestName := workRate, "same DB work"
		if consumeCeiling < lowest {
			lowest, lowestName = consumeCeiling, "raw consume"
		}
		record(figure{Name: "consumer drain (sql upsert handler)", Value: firstRate, Unit: "events/s", CeilingName: lowestName, Ceiling: lowest,
			Target: ">= 25k ev/s and >= 0.60 of ceiling", Met: met(firstRate >= 25_000 && firstRate >= 0.6*lowest),
			Notes: []string{fmt.Sprintf("group join + first fetch %s (not timed); ceiling is the lower of raw consume and the same database work without Kafka", firstJoin.Round(time.Millisecond))}})
		rep.measure()(figure{Name: "consumer drain (sql upsert handler) vs raw inbox insert", Value: firstRate, Unit: "events/s",
			CeilingName: "raw inbox insert", Ceiling: ceilRate, Notes: []string{"the same drain beside the insert-only ceiling (the round-1 ratio)"}})
		if !full {
			return
		}
		// Replay right after the first delivery: the new rows may not be
		// all-visible yet (autovacuum has not processed the table), so each
		// probe visits the heap.
		dups, dupJoin := drain(b, db.Pool, topic, "replay", h, "onceflow_consumer_duplicates_total", n)
		// Replay once VACUUM has set the visibility map: index-only probes,
		// the steady state for redeliveries of older events.
		if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE onceflow.inbox`); err != nil {
			b.Fatal(err)
		}
		warmDups, _ := drain(b, db.Pool, topic, "replay-vacuumed", h, "onceflow_consumer_duplicates_total", n)

		var rows int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.inbox`).Scan(&rows); err != nil {
			b.Fatal(err)
		}
		if rows != len(ids) {
			b.Fatalf("%d inbox rows after the drain, want %d", rows, len(ids))
		}

		// The same with a Go BatchHandler doing the upsert set-based: one
		// statement per batch instead of one per event.
		for _, q := range []string{`TRUNCATE onceflow.inbox, onceflow.consumer_offsets, onceflow.seq_state, onceflow.seq_applied, onceflow.seq_gaps, public.bench_state`, `VACUUM ANALYZE onceflow.inbox`} {
			if _, err := db.Pool.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
		record = rep.measure()
		setBased, _ := drain(b, db.Pool, topic, "setbased", upsertBatch{}, "onceflow_consumer_processed_total", n)
		setRate := float64(n) / setBased.Seconds()
		record(figure{Name: "consumer drain (Go set-based BatchHandler)", Value: setRate, Unit: "events/s", CeilingName: lowestName, Ceiling: lowest})

		dupRate := float64(n) / dups.Seconds()
		warmRate := float64(n) / warmDups.Seconds()
		if bb, ok := b.(*testing.B); ok {
			bb.ReportMetric(firstRate, "events/s")
			bb.ReportMetric(ceilRate, "ceiling_events/s")
			bb.ReportMetric(100*firstRate/ceilRate, "%_of_ceiling")
			bb.ReportMetric(dupRate, "duplicates/s")
			bb.ReportMetric(dupRate/firstRate, "duplicate_speedup")
			bb.ReportMetric(warmRate/firstRate, "vacuumed_duplicate_speedup")
			bb.ReportMetric(setRate, "setbased_events/s")
		}
		fmt.Printf("consumer drain: %d events (%d B payloads, %d partitions, batches of 500)\n"+
			"  first delivery, sql handler (one upsert per event): %.0f ev/s in %s (+ group join %s)\n"+
			"  ceiling, raw batched INSERT … unnest … ON CONFLICT DO NOTHING: %.0f ev/s in %s -> %.0f%% of ceiling\n"+
			"  duplicates-only replay (new group, same consumer name): %.0f ev/s in %s (+ join %s) -> %.1fx first delivery\n"+
			"  the same replay after VACUUM (index-only probes): %.0f ev/s in %s -> %.1fx first delivery\n"+
			"  first delivery, Go BatchHandler (set-based upsert per batch): %.0f ev/s in %s -> %.0f%% of ceiling\n",
			n, benchPayload, benchPartitions,
			firstRate, first.Round(time.Millisecond), firstJoin.Round(time.Millisecond),
			ceilRate, ceiling.Round(time.Millisecond), 100*firstRate/ceilRate,
			dupRate, dups.Round(time.Millisecond), dupJoin.Round(time.Millisecond), dupRate/firstRate,
			warmRate, warmDups.Round(time.Millisecond), warmRate/firstRate,
			setRate, setBased.Round(time.Millisecond), 100*setRate/ceilRate)
	}
}

// prefill produces n events with 256-byte payloads and returns their ids,
// also grouped by the partition they landed on.
func prefill(b testing.TB, topic string, n int) ([]string, [][]benchRow) {
	b.Helper()
	return prefillIDs(b, topic, n, "bench-")
}

// prefillIDs is prefill with event ids prefix0, prefix1, ….
func prefillIDs(b testing.TB, topic string, n int, prefix string) ([]string, [][]benchRow) {
	b.Helper()
	return prefillWith(b, topic, n, func(i int) string { return prefix + strconv.Itoa(i) })
}

// prefillWith is prefill with event ids id(0), id(1), ….
func prefillWith(b testing.TB, topic string, n int, id func(int) string) ([]string, [][]benchRow) {
	b.Helper()
	return prefillSeqs(b, topic, n, id, nil)
}

// prefillSeqs is prefillWith producing, as the k-th event of source src,
// seq(src, k) instead of k (nil: k).
func prefillSeqs(b testing.TB, topic string, n int, id func(int) string, seq func(src int, k int64) int64) ([]string, [][]benchRow) {
	b.Helper()
	cl := testkit.Client(b, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond),
		kgo.MaxBufferedRecords(100_000), kgo.ProducerBatchMaxBytes(1<<20))
	pad := strings.Repeat("x", benchPayload-len(`{"pad":""}`))
	payload := []byte(`{"pad":"` + pad + `"}`)
	ids := make([]string, n)
	per := make([][]benchRow, benchPartitions)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	seqs := make([]int64, benchSources)
	start := time.Now()
	for i := range n {
		src := i % benchSources
		seqs[src]++
		k := seqs[src]
		if seq != nil {
			k = seq(src, k)
		}
		ev := envelope.Envelope{EventID: id(i), Source: fmt.Sprintf("src-%d", src), Seq: k,
			EventType: "bench.event", Payload: payload}
		ids[i] = ev.EventID
		wg.Add(1)
		cl.Produce(context.Background(), ev.Record(topic), func(r *kgo.Record, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if err == nil {
				per[r.Partition] = append(per[r.Partition], benchRow{id: ev.EventID, source: ev.Source, seq: ev.Seq, offset: r.Offset})
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatalf("prefill: %v", firstErr)
	}
	b.Logf("prefilled %d events in %s", n, time.Since(start).Round(time.Millisecond))
	return ids, per
}

// upsertBatch is the one-row-per-source upsert with the monotonic guard,
// done for a whole batch in one statement: per source, the highest seq of the
// batch wins.
type upsertBatch struct{}

func (upsertBatch) HandleBatch(ctx context.Context, tx pgx.Tx, evs []inbox.Event) error {
	latest := make(map[string]int64, len(evs))
	counts := make(map[string]int64, len(evs))
	for _, ev := range evs {
		if ev.Seq > latest[ev.Source] {
			latest[ev.Source] = ev.Seq
		}
		counts[ev.Source]++
	}
	srcs := make([]string, 0, len(latest))
	seqs := make([]int64, 0, len(latest))
	ns := make([]int64, 0, len(latest))
	for src, seq := range latest {
		srcs, seqs, ns = append(srcs, src), append(seqs, seq), append(ns, counts[src])
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO public.bench_state (source, seq, n)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])
		ON CONFLICT (source) DO UPDATE SET seq = EXCLUDED.seq, n = bench_state.n + EXCLUDED.n
		WHERE bench_state.seq < EXCLUDED.seq`, srcs, seqs, ns)
	return err
}

type benchRow struct {
	id, source string
	seq        int64
	offset     int64
}

// rawInsertCeiling inserts the ids into onceflow.inbox the fastest plain way
// (one goroutine per partition, batches of size) and returns the time.
func rawInsertCeiling(b testing.TB, pool *pgxpool.Pool, per [][]benchRow, size int) time.Duration {
	b.Helper()
	const q = `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at)
		SELECT 'ceiling', e.id, e.source, e.seq, 'bench.event', 'bench', $1, e.off, 'processed', now()
		FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS e(id, source, seq, off)
		ON CONFLICT DO NOTHING`
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(per))
	for p, rows := range per {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < len(rows); i += size {
				chunk := rows[i:min(i+size, len(rows))]
				ids, srcs := make([]string, len(chunk)), make([]string, len(chunk))
				seqs, offs := make([]int64, len(chunk)), make([]int64, len(chunk))
				for j, r := range chunk {
					ids[j], srcs[j], seqs[j], offs[j] = r.id, r.source, r.seq, r.offset
				}
				if _, err := pool.Exec(context.Background(), q, p, ids, srcs, seqs, offs); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("ceiling insert: %v", err)
	}
	return time.Since(start)
}

// benchHandlerSQL is the sql handler's statement of the consumer
// benchmarks, with positional parameters: $1 source, $2 seq.
const benchHandlerSQL = `INSERT INTO public.bench_state (source, seq, n) VALUES ($1, $2, 1)
	ON CONFLICT (source) DO UPDATE SET seq = EXCLUDED.seq, n = bench_state.n + 1 WHERE bench_state.seq < EXCLUDED.seq`

// sameWorkCeiling does the consumer's database work for the rows without
// Kafka or onceflow: one goroutine per partition, and per batch of size one
// transaction holding the raw batched inbox insert and the sql handler's
// statement for every row, sent in one pipeline. It returns the time.
func sameWorkCeiling(b testing.TB, pool *pgxpool.Pool, per [][]benchRow, size int) time.Duration {
	b.Helper()
	const q = `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at)
		SELECT 'ceiling', e.id, e.source, e.seq, 'bench.event', 'bench', $1, e.off, 'processed', now()
		FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS e(id, source, seq, off)
		ON CONFLICT DO NOTHING`
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(per))
	for p, rows := range per {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < len(rows); i += size {
				chunk := rows[i:min(i+size, len(rows))]
				ids, srcs := make([]string, len(chunk)), make([]string, len(chunk))
				seqs, offs := make([]int64, len(chunk)), make([]int64, len(chunk))
				for j, r := range chunk {
					ids[j], srcs[j], seqs[j], offs[j] = r.id, r.source, r.seq, r.offset
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var batch pgx.Batch
					batch.Queue(q, p, ids, srcs, seqs, offs)
					for j := range chunk {
						batch.Queue(benchHandlerSQL, srcs[j], seqs[j])
					}
					return tx.SendBatch(ctx, &batch).Close()
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("same-work ceiling: %v", err)
	}
	return time.Since(start)
}

// drain runs a consumer in a fresh group until metric reaches n and returns
// the time from the first applied batch to the last, and the time before
// the first batch (group join and first fetch).
func drain(b testing.TB, pool *pgxpool.Pool, topic, group string, h inbox.BatchHandler, metric string, n int, opts ...func(*inbox.Config)) (time.Duration, time.Duration) {
	b.Helper()
	reg := prometheus.NewRegistry()
	cfg := inbox.Config{
		BatchHandler: h, Group: group + "-" + topic, Topics: []string{topic}, Pool: pool, Registerer: reg,
		KafkaOpts: []kgo.Opt{kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(b), ",")...)},
	}
	if os.Getenv("ONCEFLOW_BENCH_CONSUMER_ORDERING") == "arrival" { // to measure the sequence guard's cost
		cfg.Ordering = inbox.OrderArrival
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := inbox.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.Run(ctx) }()
	firstAt, end := waitCounter(b, reg, metric, 0, float64(n), 30*time.Minute)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return end.Sub(firstAt), firstAt.Sub(start)
}

// rawConsumeCeiling reads the n records of topic with a plain read_committed
// franz-go consumer and records the rate.
func rawConsumeCeiling(tb testing.TB, rep *report, topic string, n int) float64 {
	tb.Helper()
	record := rep.measure()
	cl, err := kgo.NewClient(append(relayKafkaOpts(tb), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))...)
	if err != nil {
		tb.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start, seen := time.Now(), 0
	for seen < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			tb.Fatalf("raw consume: %d of %d records: %v", seen, n, err)
		}
		fs.EachError(func(t string, p int32, err error) { tb.Fatalf("raw consume %s/%d: %v", t, p, err) })
		seen += fs.NumRecords()
	}
	rate := float64(n) / time.Since(start).Seconds()
	record(figure{Name: "ceiling: raw franz-go consume (read_committed)", Value: rate, Unit: "events/s",
		Notes: []string{fmt.Sprintf("%d records of %d B from %d partitions, from client start", n, benchPayload, benchPartitions)}})
	return rate
}

// sqlUpsertHandler is the sql handler of the consumer benchmarks: one upsert
// per event with the monotonic guard (ONCEFLOW_BENCH_CONSUMER_HANDLER=log
// swaps in the ledger-only log handler, to see where the time goes).
func sqlUpsertHandler(tb testing.TB) inbox.BatchHandler {
	tb.Helper()
	handlers := filepath.Join(tb.TempDir(), "handlers.json")
	spec := `{"handlers": [{"event_type": "*", "kind": "sql", "sql":
		"INSERT INTO public.bench_state (source, seq, n) VALUES (:source, :seq, 1) ON CONFLICT (source) DO UPDATE SET seq = EXCLUDED.seq, n = bench_state.n + 1 WHERE bench_state.seq < EXCLUDED.seq"}]}`
	if os.Getenv("ONCEFLOW_BENCH_CONSUMER_HANDLER") == "log" {
		spec = `{"handlers": [{"event_type": "*", "kind": "log"}]}`
	}
	if err := os.WriteFile(handlers, []byte(spec), 0o600); err != nil {
		tb.Fatal(err)
	}
	h, err := handlerfile.Load(handlers)
	if err != nil {
		tb.Fatal(err)
	}
	return h
}
