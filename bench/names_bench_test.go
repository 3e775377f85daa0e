package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/retention"
)

// BenchmarkConsumerNames measures a consumer's drain in a database that
// many services share: beside the inbox partitions of other consumer names
// (ONCEFLOW_BENCH_OTHER_NAMES, default 20, each with the nine buckets of a
// 720h lane), against the same drain in a database of its own. A batch's
// statements must plan and lock the consumer's own partitions only. It
// runs twice: with each source's events in order, and with them in
// swapped pairs (2, 1, 4, 3, ...: every other event parked behind a gap,
// then released when the next one fills it).
func BenchmarkConsumerNames(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	consumerNames(b, benchReport, sz.GrowthEvents, sz.OtherNames, false)
	consumerNames(b, benchReport, sz.GrowthEvents, sz.OtherNames, true)
}

// swappedPairs is the k-th seq of source src of n events over benchSources
// sources in swapped pairs: 2, 1, 4, 3, ..., the last one in place when the
// source has an odd number of events.
func swappedPairs(n int) func(src int, k int64) int64 {
	return func(src int, k int64) int64 {
		count := int64((n - src + benchSources - 1) / benchSources)
		switch {
		case k%2 == 1 && k < count:
			return k + 1
		case k%2 == 0:
			return k - 1
		}
		return k
	}
}

// consumerNames drains n events (UUIDv7 ids) three times into each of two
// databases, alternating: one of the draining consumer names alone (and
// the earlier rounds' names), one that also holds the partitions of other
// consumer names. Each drain is a consumer name of its own. swapped: each
// source's events in swapped pairs.
func consumerNames(tb testing.TB, rep *report, n, others int, swapped bool) {
	ctx := context.Background()
	policy, err := retention.Parse([]byte(`{"classes": [{"match": "*", "keep": "720h"}]}`))
	if err != nil {
		tb.Fatal(err)
	}
	h := sqlUpsertHandler(tb)
	// prepare gives a consumer name the policy's lane for the events' type
	// and its nine buckets.
	prepare := func(pool *pgxpool.Pool, consumer string) {
		tb.Helper()
		if _, err := retention.Prune(ctx, pool, policy, retention.Options{Consumer: consumer}); err != nil {
			tb.Fatal(err)
		}
		var lane string
		if err := pool.QueryRow(ctx, `SELECT onceflow.inbox_lane($1, 'bench.event')`, consumer).Scan(&lane); err != nil {
			tb.Fatal(err)
		}
		for i := range 9 {
			if _, err := pool.Exec(ctx, fmt.Sprintf(`SELECT onceflow.inbox_ensure_buckets($1, $2, now() - %d * interval '90 hours')`, i), consumer, lane); err != nil {
				tb.Fatal(err)
			}
		}
	}
	alone, shared := testkit.NewDB(tb), testkit.NewDB(tb)
	for _, db := range []*testkit.DB{alone, shared} {
		if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.bench_state (source text PRIMARY KEY, seq bigint NOT NULL, n bigint NOT NULL)`); err != nil {
			tb.Fatal(err)
		}
	}
	for i := range others {
		prepare(shared.Pool, fmt.Sprintf("other-%d", i))
	}
	var partitions int
	if err := shared.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'onceflow.inbox'::regclass`).Scan(&partitions); err != nil {
		tb.Fatal(err)
	}
	var aloneRates, sharedRates, ratios []float64
	var aloneCPU, sharedCPU string
	for r := range growthRounds {
		topic := testkit.Topic(tb, fmt.Sprintf("bench-names-%d-%t", r, swapped), benchPartitions, nil)
		var seq func(int, int64) int64
		if swapped {
			seq = swappedPairs(n)
		}
		prefillSeqs(tb, topic, n, func(int) string { return outbox.NewEventID() }, seq)
		one := func(db *testkit.DB, side string) (float64, string) {
			// A name (and so a Kafka group) of its own per drain.
			consumer := fmt.Sprintf("drain-%d-%s-%t", r, side, swapped)
			prepare(db.Pool, consumer)
			// The handler's table starts empty for each drain (the
			// events' sources and seqs are the same in every round).
			if _, err := db.Pool.Exec(ctx, `TRUNCATE public.bench_state`); err != nil {
				tb.Fatal(err)
			}
			cpu := startCPU(tb, db.Pool)
			took, _ := drain(tb, db.Pool, topic, consumer, h, "onceflow_consumer_processed_total", n,
				func(c *inbox.Config) { c.ConsumerName = consumer })
			if swapped {
				// Every pair parked its first event behind a gap the
				// second filled; none was late.
				var filled, late int
				if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM onceflow.seq_gaps WHERE consumer = $1 AND state = 'filled'),
					(SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND late)`, consumer).Scan(&filled, &late); err != nil {
					tb.Fatal(err)
				}
				want := 0 // one per pair
				for src := range benchSources {
					want += (n - src + benchSources - 1) / benchSources / 2
				}
				if filled != want || late != 0 {
					tb.Fatalf("%s: %d gaps filled, want %d; %d events late, want 0", consumer, filled, want, late)
				}
			}
			return float64(n) / took.Seconds(), cpu(n)
		}
		var a, s float64
		if r%2 == 0 {
			a, aloneCPU = one(alone, "alone")
			s, sharedCPU = one(shared, "shared")
		} else {
			s, sharedCPU = one(shared, "shared")
			a, aloneCPU = one(alone, "alone")
		}
		tb.Logf("names round %d: alone %.0f ev/s, beside %d others %.0f ev/s, ratio %.2f", r, a, others, s, s/a)
		aloneRates, sharedRates, ratios = append(aloneRates, a), append(sharedRates, s), append(ratios, s/a)
	}
	aloneRate, sharedRate := medianOf(aloneRates), medianOf(sharedRates)
	order, how := "", "in order"
	if swapped {
		order, how = ", each source's events in swapped pairs", "in swapped pairs per source: every other one parked, then released"
	}
	record := rep.measure()
	record(figure{Name: "consumer drain, its consumer name alone in the database" + order, Value: aloneRate, Unit: "events/s",
		Notes: []string{fmt.Sprintf("median of %d drains of %d events (UUIDv7 ids, %s; sql upsert handler): %s", growthRounds, n, how, joinRates(aloneRates, "%.0f")), aloneCPU}})
	record(figure{Name: fmt.Sprintf("consumer drain beside %d other consumer names%s", others, order), Value: sharedRate, Unit: "events/s",
		CeilingName: "alone", Ceiling: aloneRate, Target: "ratio >= 0.9", Met: met(sharedRate >= 0.9*aloneRate),
		Notes: []string{fmt.Sprintf("the others' inbox partitions: %d of the database's %d (nine buckets of a 720h lane each, empty); median of %d drains interleaved with the lone ones: %s; the rounds' ratios %s",
			others*9, partitions, growthRounds, joinRates(sharedRates, "%.0f"), joinRates(ratios, "%.2f")), sharedCPU}})
}
