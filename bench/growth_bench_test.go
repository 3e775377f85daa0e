package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/retention"
)

// BenchmarkGrowth measures how throughput holds up as tables grow:
//
//   - consumer: the drain of the same topic with an empty inbox and with the
//     inbox pre-filled (ONCEFLOW_BENCH_INBOX_ROWS, default 10M rows, one
//     INSERT … SELECT generate_series spread over the nine time buckets of
//     the events' 720h lane, then VACUUM ANALYZE and a CHECKPOINT);
//   - relay: the rate with a 1M-row backlog (ONCEFLOW_BENCH_RELAY_PENDING;
//     the first ONCEFLOW_BENCH_RELAY_WINDOW events timed) against backlogs of
//     10k (five rounds), each timed from the backlog's commit.
func BenchmarkGrowth(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	b.Run("consumer", func(b *testing.B) { consumerGrowth(b, benchReport, sz.GrowthEvents, sz.InboxRows) })
	b.Run("relay", func(b *testing.B) { relayGrowth(b, benchReport, sz) })
}

func consumerGrowth(tb testing.TB, rep *report, n, inboxRows int) {
	ctx := context.Background()
	db := testkit.NewDB(tb)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.bench_state (source text PRIMARY KEY, seq bigint NOT NULL, n bigint NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	h := sqlUpsertHandler(tb)
	exec := func(qs ...string) {
		for _, q := range qs {
			if _, err := db.Pool.Exec(ctx, q); err != nil {
				tb.Fatalf("%s: %v", q, err)
			}
		}
	}
	// The inbox's layout with a retention policy (migration 028): the
	// events' type gets a 720h lane (buckets of 90 hours), which the
	// pre-fill below spreads over nine buckets, as a month of history.
	// Every consumer name the drains use gets the same classes, so an
	// empty-inbox drain has the same lanes and buckets, only empty.
	policy, err := retention.Parse([]byte(`{"classes": [{"match": "*", "keep": "720h"}]}`))
	if err != nil {
		tb.Fatal(err)
	}
	for _, consumer := range append([]string{"default"}, emptyConsumers()...) {
		if _, err := retention.Prune(ctx, db.Pool, policy, retention.Options{Consumer: consumer}); err != nil {
			tb.Fatal(err)
		}
	}
	var lane string
	if err := db.Pool.QueryRow(ctx, `SELECT onceflow.inbox_lane('default', 'bench.event')`).Scan(&lane); err != nil {
		tb.Fatal(err)
	}
	exec(`VACUUM ANALYZE onceflow.inbox`)
	// The raw insert into the empty inbox, before the fill: how much of the
	// change is PostgreSQL's index growth alone.
	topic0 := testkit.Topic(tb, "bench-growth-raw", benchPartitions, nil)
	_, per := prefill(tb, topic0, n)
	record := rep.measure()
	rawEmpty := float64(n) / rawInsertCeiling(tb, db.Pool, per, 500).Seconds()
	record(figure{Name: "raw batched inbox insert, empty inbox", Value: rawEmpty, Unit: "events/s"})
	exec(`TRUNCATE onceflow.inbox`)

	t0 := time.Now()
	for i := range 9 {
		exec(fmt.Sprintf(`SELECT onceflow.inbox_ensure_buckets('default', '%s', now() - %d * interval '90 hours')`, lane, i))
	}
	// In statements of 10M rows at most, each its own transaction, so that
	// a fill of 100M shows its progress and no one statement's WAL and
	// memory grow with the size.
	const fillChunk = 10_000_000
	for from := 1; from <= inboxRows; from += fillChunk {
		to := min(from+fillChunk-1, inboxRows)
		exec(fmt.Sprintf(`INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, lane, event_at)
			SELECT 'default', 'old-' || g, 'old-' || (g %% 100000), g / 100000 + 1, 'bench.event', 'old', g %% 4, g, 'processed', now(), '%s',
			       now() - (g %% 9) * interval '90 hours'
			  FROM generate_series(%d, %d) g`, lane, from, to))
		if inboxRows > fillChunk {
			tb.Logf("inbox pre-fill: %d of %d rows after %s", to, inboxRows, time.Since(t0).Round(time.Second))
		}
	}
	fill := time.Since(t0)
	t1 := time.Now()
	exec(`VACUUM ANALYZE onceflow.inbox`)
	vacuum := time.Since(t1)
	// The fill writes gigabytes (the rows, their indexes, then VACUUM's
	// visibility map and hint bits): without a checkpoint here the drains
	// run while PostgreSQL checkpoints them and the kernel writes them back
	// (measured: a requested checkpoint during the drain, backends writing
	// 9k dirty buffers themselves, WAL fsyncs 2.7× slower), a cost of the
	// bulk load that neither drain should pay.
	t2 := time.Now()
	exec(`CHECKPOINT`)
	checkpoint := time.Since(t2)

	// Every row of this database was written under the constraint
	// inbox_id_time (migration 036 ran when the database was made, before
	// the fill; the fill's ids are not UUIDv7s, which it lets through): as
	// on a consumer that has run under it for a whole retention period, the
	// probe of a UUIDv7 key skips the buckets older than the id.
	exec(`UPDATE onceflow.inbox_id_time SET since = '-infinity'`)
	// Retention's pass, as a consumer's -retention-interval runs it: no
	// bucket has expired (the oldest is 720 hours old), and the eight past
	// buckets are sealed and their ids' filters stored (migration 037), so
	// the probe of an id of the producer's own reads the current bucket and
	// the sealed ones whose filter may hold it (about 1 %), not all nine.
	t3 := time.Now()
	pass, err := retention.Prune(ctx, db.Pool, policy, retention.Options{Consumer: "default"})
	if err != nil {
		tb.Fatal(err)
	}
	seal := time.Since(t3)
	tb.Logf("retention pass after the fill: %d buckets sealed in %s", pass.BucketsSealed, seal.Round(time.Millisecond))

	// The drains, interleaved: each round produces, for each kind of event
	// id, a topic of n new events and drains it twice, once as the consumer
	// whose inbox holds the pre-filled rows ("default") and once as a
	// consumer name of its own whose buckets are empty, in the same
	// database at the same moment, the order alternating. A drain of a few
	// seconds varies by 20-40 % from one to the next on this machine (round
	// 5); the median of each side over the rounds and the spread of the
	// rounds' ratios are reported. The two kinds of ids: UUIDv7s, what the
	// outbox generates, whose probe reads the buckets from the id's time on
	// (migration 036), and ids of the producer's own, probed in every
	// bucket of the lane.
	for k, kind := range growthIDKinds {
		var filledRates, emptyRates, ratios []float64
		var filledCPU, emptyCPU string
		for r := range growthRounds {
			topic := testkit.Topic(tb, fmt.Sprintf("bench-growth-%s-%d", kind.name, r), benchPartitions, nil)
			prefillWith(tb, topic, n, kind.id(r))
			// Each drain starts from the same state: the sources' streams
			// and the handler's table are new to it (the events' sources
			// and seqs are the same in every round).
			one := func(consumer string) (float64, string) {
				exec(`TRUNCATE onceflow.seq_state, onceflow.seq_applied, onceflow.seq_gaps, public.bench_state`)
				cpu := startCPU(tb, db.Pool)
				took, _ := drain(tb, db.Pool, topic, consumer, h, "onceflow_consumer_processed_total", n,
					func(c *inbox.Config) { c.ConsumerName = consumer })
				return float64(n) / took.Seconds(), cpu(n)
			}
			empty := emptyConsumers()[k*growthRounds+r]
			var fr, er float64
			if r%2 == 0 {
				fr, filledCPU = one("default")
				er, emptyCPU = one(empty)
			} else {
				er, emptyCPU = one(empty)
				fr, filledCPU = one("default")
			}
			tb.Logf("growth round %d, %s: filled %.0f ev/s, empty %.0f ev/s, ratio %.2f", r, kind.name, fr, er, fr/er)
			filledRates, emptyRates, ratios = append(filledRates, fr), append(emptyRates, er), append(ratios, fr/er)
		}
		emptyRate, filledRate := medianOf(emptyRates), medianOf(filledRates)
		ratio := filledRate / emptyRate
		record = rep.measure()
		record(figure{Name: fmt.Sprintf("consumer drain, empty inbox, %s", kind.label), Value: emptyRate, Unit: "events/s",
			Notes: []string{fmt.Sprintf("median of %d drains of %d events, each by a consumer name of its own (empty buckets) beside the filled inbox: %s", growthRounds, n, joinRates(emptyRates, "%.0f")), emptyCPU}})
		record(figure{Name: fmt.Sprintf("growth: consumer drain, inbox pre-filled with %d rows, %s", inboxRows, kind.label), Value: filledRate, Unit: "events/s",
			CeilingName: "empty inbox", Ceiling: emptyRate, Target: "ratio >= 0.8", Met: met(ratio >= 0.8),
			Notes: []string{fmt.Sprintf("median of %d drains interleaved with the empty ones: %s; the rounds' ratios %s", growthRounds, joinRates(filledRates, "%.0f"), joinRates(ratios, "%.2f")),
				fmt.Sprintf("pre-fill %s, VACUUM ANALYZE %s, CHECKPOINT %s, retention pass sealing %d buckets %s (not timed)", fill.Round(time.Second), vacuum.Round(time.Second), checkpoint.Round(time.Second), pass.BucketsSealed, seal.Round(time.Second)), filledCPU}})
	}
	record = rep.measure()
	rawFilled := float64(n) / rawInsertCeiling(tb, db.Pool, per, 500).Seconds()
	record(figure{Name: fmt.Sprintf("growth: raw batched inbox insert, %d rows", inboxRows), Value: rawFilled, Unit: "events/s",
		CeilingName: "empty inbox", Ceiling: rawEmpty})
}

// joinRates writes xs in format f, comma-separated.
func joinRates(xs []float64, f string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(f, x)
	}
	return strings.Join(parts, ", ")
}

// growthRounds is how many interleaved pairs of drains BenchmarkGrowth's
// consumer part runs.
const growthRounds = 3

// growthIDKinds are the kinds of event ids BenchmarkGrowth's consumer part
// drains; id(r) gives round r's ids.
var growthIDKinds = []struct {
	name, label string
	id          func(r int) func(i int) string
}{
	{"uuidv7", "UUIDv7 ids (generated by the outbox)", func(int) func(int) string {
		return func(int) string { return outbox.NewEventID() }
	}},
	{"own", "ids of the producer's own (not UUIDv7)", func(r int) func(int) string {
		return func(i int) string { return fmt.Sprintf("round-%d-%d", r, i) }
	}},
}

// emptyConsumers names the empty side's consumer in each round of each
// kind of ids.
func emptyConsumers() []string {
	names := make([]string, growthRounds*len(growthIDKinds))
	for r := range names {
		names[r] = fmt.Sprintf("empty-%d", r)
	}
	return names
}

// medianOf returns the median of xs (the mean of the middle two for an
// even count).
func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// startCPU samples the CPU seconds of this process (the consumer runs in it)
// and of every process of the PostgreSQL server; the returned function
// gives, as a note, each one's CPU per event since then. CPU per event does
// not move with the machine's load the way a rate does (a shared server
// also counts other databases' work).
func startCPU(tb testing.TB, pool *pgxpool.Pool) func(events int) string {
	tb.Helper()
	pm := postmasterPid(tb, pool)
	pg := func() float64 {
		if pm == 0 {
			return math.NaN()
		}
		return cpuTree(pm)
	}
	self, server := cpuOf(os.Getpid()), pg()
	return func(events int) string {
		return fmt.Sprintf("CPU per event: this process (the consumer) %.1f µs, PostgreSQL (every process of the server) %.1f µs",
			(cpuOf(os.Getpid())-self)/float64(events)*1e6, (pg()-server)/float64(events)*1e6)
	}
}

func relayGrowth(tb testing.TB, rep *report, sz sizes) {
	ctx := context.Background()
	db := testkit.NewDB(tb)
	topic := testkit.Topic(tb, "bench-growth-relay", benchPartitions, nil)
	reg := prometheus.NewRegistry()
	stop := startBenchRelay(tb, db, relayBenchBatch, false, false, reg)
	defer stop()
	const published = "onceflow_relay_published_total"
	next := 0
	backlog := func(n int) time.Time {
		if _, err := db.Pool.Exec(ctx, `
			INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, payload)
			SELECT 'ev-' || g, $1, 'src-' || (g % 256), g / 256 + 1, 'bench.event', 'application/octet-stream',
			       decode(repeat('ab', $4::int), 'hex')
			  FROM generate_series($2::bigint, $2::bigint + $3::bigint - 1) g`, topic, next, n, relayBenchPayload); err != nil {
			tb.Fatal(err)
		}
		next += n
		return time.Now()
	}
	// Warm up: the relay's lease, producer id and topic metadata.
	backlog(1)
	waitCounter(tb, reg, published, 0, 1, 3*time.Minute)

	record := rep.measure()
	var small time.Duration
	for range sz.RelayRounds {
		before := gauge(reg, published)
		t0 := backlog(sz.RelayBase)
		_, done := waitCounter(tb, reg, published, before, before+float64(sz.RelayBase), 10*time.Minute)
		small += done.Sub(t0)
	}
	smallRate := float64(sz.RelayBase*sz.RelayRounds) / small.Seconds()
	record(figure{Name: fmt.Sprintf("relay drain, %d pending (x%d)", sz.RelayBase, sz.RelayRounds), Value: smallRate, Unit: "events/s",
		Notes: []string{"in-process relay, mark mode, timed from the backlog's commit to its last row published"}})

	before := gauge(reg, published)
	t1 := time.Now()
	t0 := backlog(sz.RelayPending)
	insert := t0.Sub(t1)
	record = rep.measure()
	_, done := waitCounter(tb, reg, published, before, before+float64(sz.RelayWindow), 30*time.Minute)
	bigRate := float64(sz.RelayWindow) / done.Sub(t0).Seconds()
	ratio := bigRate / smallRate
	record(figure{Name: fmt.Sprintf("growth: relay drain, %d pending", sz.RelayPending), Value: bigRate, Unit: "events/s",
		CeilingName: fmt.Sprintf("%d pending", sz.RelayBase), Ceiling: smallRate, Target: "ratio >= 0.8", Met: met(ratio >= 0.8),
		Notes: []string{fmt.Sprintf("first %d events timed from the backlog's commit; backlog INSERT took %s (not timed)", sz.RelayWindow, insert.Round(time.Second))}})
}
