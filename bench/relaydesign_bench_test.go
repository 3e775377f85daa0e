package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
)

// BenchmarkRelayDesigns measures, without Kafka, the database work of the
// relay's default mode under the designs it was chosen from (round 2 picked
// the queue by this benchmark; migration relay_queue built it): per batch of
// 1000 events a producer inserts the rows (set-based, the same statement for
// every design), the relay fetches the 1000 oldest unpublished rows and
// records them as published. The designs run interleaved batch by batch on
// one connection (a drift in the machine's load hits all alike), each over a
// standing backlog of 10k unpublished rows, and published rows are kept (as
// the retention does):
//
//   - mark: the default before migration relay_queue, UPDATE published_at
//     on a copy of the outbox with that column and its two partial indexes
//     (not HOT: the column is in their predicates, so every index gets a
//     new entry);
//   - delete: -delete-on-publish (published rows are gone), on the same
//     layout;
//   - move: DELETE … RETURNING into a published table (primary key and a
//     BRIN index on published_at);
//   - queue: today's default, on onceflow.outbox itself: its trigger queues
//     the ids in onceflow.outbox_pending, the relay reads the queue joined
//     to the outbox, deletes the batch's ids from it and logs the batch in
//     onceflow.outbox_published.
//
// ONCEFLOW_BENCH_RELAY_DESIGN_BATCHES (200) batches per design.
func BenchmarkRelayDesigns(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	relayDesigns(b, benchReport, sz.RelayDesignBatches)
}

type relayDesign struct {
	name    string
	setup   []string
	table   string // the rows' table
	produce string // $1 event ids, $2 sources, $3 seqs, $4 payloads
	fetch   string // $1 limit; returns id, payload
	mark    []string
}

func relayDesigns(tb testing.TB, rep *report, batches int) {
	ctx := context.Background()
	db := testkit.NewDB(tb)
	const cols = `(event_id, topic, source, seq, event_type, payload)`
	produce := func(table string) string {
		return `INSERT INTO ` + table + ` ` + cols + `
			SELECT e, 'bench', s, q, 'bench.event', p FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bytea[]) AS m(e, s, q, p)`
	}
	fetch := func(table string) string {
		return `SELECT id, event_id, topic, source, seq, event_type, content_type, record_key, headers, payload FROM ` + table + `
			WHERE published_at IS NULL ORDER BY id LIMIT $1`
	}
	// The outbox as it was before the queue: a published_at column and
	// partial indexes of unpublished and published rows.
	copyOf := func(t string) string {
		name := strings.TrimPrefix(t, "public.")
		return `CREATE TABLE ` + t + ` (LIKE onceflow.outbox INCLUDING ALL);
			ALTER TABLE ` + t + ` ADD COLUMN published_at timestamptz;
			CREATE INDEX ` + name + `_unpublished ON ` + t + ` (id) WHERE published_at IS NULL;
			CREATE INDEX ` + name + `_published_at ON ` + t + ` (published_at) WHERE published_at IS NOT NULL`
	}
	designs := []relayDesign{
		{name: "mark (UPDATE published_at, the default before the queue)", table: "public.d_mark",
			setup:   []string{copyOf("public.d_mark")},
			produce: produce("public.d_mark"), fetch: fetch("public.d_mark"),
			mark: []string{`UPDATE public.d_mark SET published_at = now() WHERE id = ANY($1::bigint[]) AND published_at IS NULL`}},
		{name: "delete (-delete-on-publish, rows gone)", table: "public.d_delete",
			setup:   []string{copyOf("public.d_delete")},
			produce: produce("public.d_delete"), fetch: fetch("public.d_delete"),
			mark: []string{`DELETE FROM public.d_delete WHERE id = ANY($1::bigint[]) AND published_at IS NULL`}},
		{name: "move (DELETE … RETURNING into a published table)", table: "public.d_move",
			setup: []string{copyOf("public.d_move"),
				`CREATE TABLE public.d_move_published (LIKE public.d_move INCLUDING DEFAULTS)`,
				`ALTER TABLE public.d_move_published ADD PRIMARY KEY (id)`,
				`CREATE INDEX ON public.d_move_published USING brin (published_at)`},
			produce: produce("public.d_move"), fetch: fetch("public.d_move"),
			mark: []string{`WITH d AS (DELETE FROM public.d_move WHERE id = ANY($1::bigint[]) AND published_at IS NULL RETURNING *)
				INSERT INTO public.d_move_published SELECT id, event_id, topic, source, seq, event_type, content_type, record_key, headers, payload, created_at, now() FROM d`}},
		{name: "queue (onceflow's default: a narrow table of unpublished ids, a publish log per batch)", table: "onceflow.outbox",
			produce: produce("onceflow.outbox"),
			fetch: `SELECT o.id, o.event_id, o.topic, o.source, o.seq, o.event_type, o.content_type, o.record_key, o.headers, o.payload
				FROM onceflow.outbox_pending p CROSS JOIN LATERAL (SELECT * FROM onceflow.outbox o WHERE o.id = p.id OFFSET 0) o ORDER BY p.id LIMIT $1`,
			mark: []string{`WITH m AS (DELETE FROM onceflow.outbox_pending WHERE id = ANY($1::bigint[]) RETURNING id)
				INSERT INTO onceflow.outbox_published (first_id, last_id, ids) SELECT min(id), max(id), array_agg(id ORDER BY id) FROM m HAVING count(*) > 0`}},
	}
	for _, d := range designs {
		for _, q := range d.setup {
			if _, err := db.Pool.Exec(ctx, q); err != nil {
				tb.Fatalf("%s: %s: %v", d.name, q, err)
			}
		}
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Release()
	const perBatch, backlog = 1000, 10_000
	payload := []byte(`{"pad":"` + strings.Repeat("x", benchPayload-10) + `"}`)
	seq := 0
	// Each design's streams count from 1, gap-free (the outbox's own
	// triggers refuse anything else since migration 015).
	streamSeq := make([][256]int64, len(designs))
	batchOf := func(d int) (ids, sources []string, seqs []int64, payloads [][]byte) {
		for i := range perBatch {
			seq++
			streamSeq[d][i%256]++
			ids = append(ids, fmt.Sprintf("d%d-%d", d, seq))
			sources = append(sources, fmt.Sprintf("src-%d", i%256))
			seqs = append(seqs, streamSeq[d][i%256])
			payloads = append(payloads, payload)
		}
		return
	}
	insert := func(c *pgxpool.Conn, d int) time.Duration {
		ids, sources, seqs, payloads := batchOf(d)
		t0 := time.Now()
		if _, err := c.Exec(ctx, designs[d].produce, ids, sources, seqs, payloads); err != nil {
			tb.Fatalf("%s: produce: %v", designs[d].name, err)
		}
		return time.Since(t0)
	}
	// The standing backlog.
	for d := range designs {
		for range backlog / perBatch {
			insert(conn, d)
		}
		if _, err := conn.Exec(ctx, `VACUUM ANALYZE `+designs[d].table); err != nil {
			tb.Fatal(err)
		}
	}
	record := rep.measure()
	produced := make([]time.Duration, len(designs))
	relayed := make([]time.Duration, len(designs))
	for range batches {
		for d, ds := range designs {
			produced[d] += insert(conn, d)
			t0 := time.Now()
			rows, err := conn.Query(ctx, ds.fetch, perBatch)
			if err != nil {
				tb.Fatalf("%s: fetch: %v", ds.name, err)
			}
			var ids []int64
			for rows.Next() {
				var id int64
				var skip [9]any
				dst := []any{&id}
				for i := range skip {
					dst = append(dst, &skip[i])
				}
				if err := rows.Scan(dst...); err != nil {
					tb.Fatalf("%s: fetch: %v", ds.name, err)
				}
				ids = append(ids, id)
			}
			if err := rows.Err(); err != nil || len(ids) != perBatch {
				tb.Fatalf("%s: fetched %d rows: %v", ds.name, len(ids), err)
			}
			err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				for _, q := range ds.mark {
					if _, err := tx.Exec(ctx, q, ids); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				tb.Fatalf("%s: mark: %v", ds.name, err)
			}
			relayed[d] += time.Since(t0)
		}
	}
	n := float64(batches * perBatch)
	deleteRate := n / relayed[1].Seconds()
	for d, ds := range designs {
		rate := n / relayed[d].Seconds()
		f := figure{Name: "relay design: " + ds.name + ", relay's database work", Value: rate, Unit: "events/s",
			CeilingName: "delete design", Ceiling: deleteRate,
			Notes: []string{fmt.Sprintf("fetch 1000 + record them published, %.1f µs per event; the producer's insert of the same rows %.1f µs per event; %d batches interleaved with the other designs over a standing backlog of %d",
				float64(relayed[d].Microseconds())/n, float64(produced[d].Microseconds())/n, batches, backlog)}}
		record(f)
	}
}
