package bench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// writeSources is how many sources each write-path transaction's events
// spread over.
const writeSources = 16

// writeLoad is how the write-path transactions run: over how many
// connections at once, and whether the connections share the same 16
// sources (they then serialize on the sources' counters, by design) or each
// has 16 of its own.
type writeLoad struct {
	conns    int
	disjoint bool
}

func (l writeLoad) String() string {
	switch {
	case l.conns == 1:
		return "1 connection"
	case l.disjoint:
		return fmt.Sprintf("%d connections, 16 sources each", l.conns)
	}
	return fmt.Sprintf("%d connections, the same 16 sources", l.conns)
}

// BenchmarkWritePath measures what a producer pays to enqueue: the same
// transactions (ONCEFLOW_BENCH_WRITE_TXNS × 1000 events of 256 B over 16
// sources, 4 connections) written six ways, in the same run:
//
//   - ceiling: a plain batched INSERT of a Debezium-style outbox row (one
//     primary key, the same payload bytes) from the client, one statement per
//     transaction;
//   - outbox.EnqueueBatch (the Go API);
//   - onceflow.enqueue, the SQL function, one call per event (pipelined),
//     and onceflow.enqueue_batch, one call per transaction;
//   - and, to split the per-event cost: the same rows inserted into
//     onceflow.outbox set-based naming no seq (the trigger outbox_assign_seq
//     gives each its seq, one call per row), into a copy of the outbox table
//     with only its primary key (no secondary index), and into
//     onceflow.outbox with the seq triggers off for the transaction (the
//     client's seqs, no counter).
//
// Everything runs over one connection (what one producer's transaction
// pays per event: the target is on these); the first three again over 4
// connections sharing the same 16 sources (producers of one source
// serialize on its counter row until commit, by design) and over 4
// connections with 16 sources each.
func BenchmarkWritePath(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	writePath(b, benchReport, sz.WriteTxns, sz.WriteTxnEvents)
}

// writeVariant runs one transaction's worth of events.
type writeVariant struct {
	name string
	run  func(ctx context.Context, tx pgx.Tx, txn int, msgs []outbox.Message) error
}

func writePath(tb testing.TB, rep *report, txns, perTxn int) {
	ctx := context.Background()
	db := testkit.NewDB(tb)
	for _, q := range []string{
		`CREATE TABLE public.bench_plain (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload bytea NOT NULL)`,
		`CREATE TABLE public.bench_outbox_pk (LIKE onceflow.outbox INCLUDING DEFAULTS INCLUDING IDENTITY)`,
		`ALTER TABLE public.bench_outbox_pk ADD PRIMARY KEY (id)`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
	payload := []byte(`{"pad":"` + strings.Repeat("x", benchPayload-10) + `"}`)
	// Client-side seqs for the variants that bypass the counter: each
	// transaction reserves its block per source.
	var clientSeq [writeSources]atomic.Int64
	seqsFor := func(msgs []outbox.Message) []int64 {
		per := map[string]int64{}
		for _, m := range msgs {
			per[m.Source]++
		}
		base := map[string]int64{}
		for src, n := range per {
			i, _ := strconv.Atoi(src[strings.LastIndexByte(src, '-')+1:])
			base[src] = clientSeq[i].Add(n) - n
		}
		out := make([]int64, len(msgs))
		for i, m := range msgs {
			base[m.Source]++
			out[i] = base[m.Source]
		}
		return out
	}
	columns := func(msgs []outbox.Message) (topics, sources, types []string, payloads [][]byte) {
		for _, m := range msgs {
			topics, sources, types, payloads = append(topics, m.Topic), append(sources, m.Source), append(types, m.EventType), append(payloads, m.Payload)
		}
		return
	}
	setBased := func(table string) func(ctx context.Context, tx pgx.Tx, _ int, msgs []outbox.Message) error {
		q := `INSERT INTO ` + table + ` (event_id, topic, source, seq, event_type, payload)
			SELECT gen_random_uuid()::text, m.topic, m.source, m.seq, m.event_type, m.payload
			  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bytea[]) AS m(topic, source, seq, event_type, payload)`
		return func(ctx context.Context, tx pgx.Tx, _ int, msgs []outbox.Message) error {
			topics, sources, types, payloads := columns(msgs)
			_, err := tx.Exec(ctx, q, topics, sources, seqsFor(msgs), types, payloads)
			return err
		}
	}
	// The same rows naming no seq: the trigger outbox_assign_seq gives each
	// its seq, one call per row.
	setBasedNoSeq := func(ctx context.Context, tx pgx.Tx, _ int, msgs []outbox.Message) error {
		topics, sources, types, payloads := columns(msgs)
		_, err := tx.Exec(ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload)
			SELECT gen_random_uuid()::text, m.topic, m.source, m.event_type, m.payload
			  FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[]) AS m(topic, source, event_type, payload)`,
			topics, sources, types, payloads)
		return err
	}
	variants := []writeVariant{
		{"plain batched INSERT, one primary key", func(ctx context.Context, tx pgx.Tx, _ int, msgs []outbox.Message) error {
			ids := make([]pgtype.UUID, len(msgs))
			for i := range ids {
				_, _ = rand.Read(ids[i].Bytes[:])
				ids[i].Bytes[6] = ids[i].Bytes[6]&0x0f | 0x40
				ids[i].Bytes[8] = ids[i].Bytes[8]&0x3f | 0x80
				ids[i].Valid = true
			}
			topics, sources, types, payloads := columns(msgs)
			_, err := tx.Exec(ctx, `INSERT INTO public.bench_plain (id, aggregatetype, aggregateid, type, payload)
				SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[])`, ids, topics, sources, types, payloads)
			return err
		}},
		{"EnqueueBatch", func(ctx context.Context, tx pgx.Tx, _ int, msgs []outbox.Message) error {
			_, err := outbox.EnqueueBatch(ctx, tx, msgs)
			return err
		}},
		{"SQL function onceflow.enqueue, one call per event", func(ctx context.Context, tx pgx.Tx, _ int, msgs []outbox.Message) error {
			// Sources in one fixed order, as docs/relay.md asks of SQL
			// producers (else two transactions deadlock on the counters).
			sorted := slices.Clone(msgs)
			slices.SortStableFunc(sorted, func(a, b outbox.Message) int { return strings.Compare(a.Source, b.Source) })
			var batch pgx.Batch
			for _, m := range sorted {
				batch.Queue(`SELECT (onceflow.enqueue($1, $2, $3, $4::jsonb)).seq`, m.Topic, m.Source, m.EventType, string(m.Payload))
			}
			return tx.SendBatch(ctx, &batch).Close()
		}},
		{"SQL function onceflow.enqueue_batch, one call per transaction", func(ctx context.Context, tx pgx.Tx, _ int, msgs []outbox.Message) error {
			events := make([]map[string]any, len(msgs))
			for i, m := range msgs {
				events[i] = map[string]any{"topic": m.Topic, "source": m.Source, "event_type": m.EventType, "payload": json.RawMessage(m.Payload)}
			}
			b, err := json.Marshal(events)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `SELECT count(*) FROM onceflow.enqueue_batch($1::jsonb)`, string(b))
			return err
		}},
		{"outbox rows set-based naming no seq (the seq trigger, once per row)", setBasedNoSeq},
		{"outbox copy with its primary key only, set-based, seq from the client", setBased("public.bench_outbox_pk")},
		{"outbox rows set-based, the seq triggers off (seq from the client, no counter)", func(ctx context.Context, tx pgx.Tx, vi int, msgs []outbox.Message) error {
			// The seq triggers of migration 015, off for this transaction only.
			if _, err := tx.Exec(ctx, `ALTER TABLE onceflow.outbox DISABLE TRIGGER outbox_assign_seq, DISABLE TRIGGER outbox_check_seq`); err != nil {
				return err
			}
			if err := setBased("onceflow.outbox")(ctx, tx, vi, msgs); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `ALTER TABLE onceflow.outbox ENABLE TRIGGER outbox_assign_seq, ENABLE TRIGGER outbox_check_seq`)
			return err
		}},
	}
	for _, load := range []writeLoad{{conns: 1}, {conns: 4}, {conns: 4, disjoint: true}} {
		vs := variants
		if load.conns > 1 {
			vs = variants[:4] // the split is read at one connection
		}
		record := rep.measure()
		var rates, perEvent []float64
		if load.conns == 1 {
			rates, perEvent = runWriteInterleaved(tb, db, vs, txns, perTxn, payload)
		} else {
			for vi, v := range vs {
				r, pe := runWriteVariant(tb, db, v, vi, load, txns, perTxn, payload)
				rates, perEvent = append(rates, r), append(perEvent, pe)
			}
		}
		how := "one after the other"
		if load.conns == 1 {
			how = "interleaved transaction by transaction (a drift in the machine's load hits every variant alike); events/s = 1 / time per event in the transaction"
		}
		for vi, v := range vs {
			rate := rates[vi]
			f := figure{Name: "write path: " + v.name + " (" + load.String() + ")", Value: rate, Unit: "events/s",
				Notes: []string{fmt.Sprintf("%d transactions × %d events (256 B, %d sources per transaction), %s, variants run %s; the producer's transaction is open %.1f µs per event", txns, perTxn, writeSources, load, how, perEvent[vi])}}
			switch vi {
			case 0:
				f.Name = "ceiling: " + f.Name
			case 1:
				f.CeilingName, f.Ceiling = "plain batched INSERT", rates[0]
				if load.conns == 1 {
					f.Target, f.Met = ">= 0.50 of ceiling", met(rate >= 0.5*rates[0])
				}
			case 2:
				f.CeilingName, f.Ceiling = "EnqueueBatch", rates[1]
			case 3:
				f.CeilingName, f.Ceiling = "EnqueueBatch", rates[1]
				if load.conns == 1 {
					f.Target, f.Met = ">= 0.70 of EnqueueBatch", met(rate >= 0.7*rates[1])
				}
			default:
				f.CeilingName, f.Ceiling = "plain batched INSERT", rates[0]
			}
			record(f)
		}
	}
}

// runWriteInterleaved runs txns transactions of perTxn events per variant
// over one connection, one transaction of each variant in turn, and returns
// per variant events/s (1 / time per event inside the transaction) and
// microseconds per event.
func runWriteInterleaved(tb testing.TB, db *testkit.DB, vs []writeVariant, txns, perTxn int, payload []byte) (rates, perEventMicros []float64) {
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Release()
	inTx := make([]time.Duration, len(vs))
	msgs := make([]outbox.Message, perTxn)
	for t := range txns {
		for vi, v := range vs {
			for i := range msgs {
				msgs[i] = outbox.Message{Topic: "bench-write", Source: fmt.Sprintf("w%d-1-src-%d", vi, (t*perTxn+i)%writeSources),
					EventType: "bench.event", Payload: payload}
			}
			t0 := time.Now()
			if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return v.run(ctx, tx, t, msgs) }); err != nil {
				tb.Fatalf("%s: %v", v.name, err)
			}
			inTx[vi] += time.Since(t0)
		}
	}
	n := float64(txns * perTxn)
	for _, d := range inTx {
		rates = append(rates, n/d.Seconds())
		perEventMicros = append(perEventMicros, float64(d.Microseconds())/n)
	}
	return rates, perEventMicros
}

// runWriteVariant runs txns transactions of perTxn events as load says and returns events/s and the mean time per event inside the
// producer's transaction (begin to commit).
func runWriteVariant(tb testing.TB, db *testkit.DB, v writeVariant, vi int, load writeLoad, txns, perTxn int, payload []byte) (rate, perEventMicros float64) {
	ctx := context.Background()
	var next atomic.Int64
	var inTx atomic.Int64 // nanoseconds
	var wg sync.WaitGroup
	errs := make(chan error, load.conns)
	start := time.Now()
	for c := range load.conns {
		wg.Add(1)
		prefix := fmt.Sprintf("w%d-%d", vi, load.conns)
		if load.disjoint {
			prefix += fmt.Sprintf("-c%d", c)
		}
		go func() {
			defer wg.Done()
			msgs := make([]outbox.Message, perTxn)
			for {
				t := int(next.Add(1)) - 1
				if t >= txns {
					return
				}
				for i := range msgs {
					msgs[i] = outbox.Message{Topic: "bench-write", Source: fmt.Sprintf("%s-src-%d", prefix, (t*perTxn+i)%writeSources),
						EventType: "bench.event", Payload: payload}
				}
				t0 := time.Now()
				if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return v.run(ctx, tx, t, msgs) }); err != nil {
					errs <- fmt.Errorf("%s: %w", v.name, err)
					return
				}
				inTx.Add(int64(time.Since(t0)))
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
	n := float64(txns * perTxn)
	return n / time.Since(start).Seconds(), float64(inTx.Load()) / 1e3 / n
}
