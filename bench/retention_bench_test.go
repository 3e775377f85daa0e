package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/retention"
)

// BenchmarkRetention measures one retention pass that expires a large
// inbox (ONCEFLOW_BENCH_RETENTION_ROWS, default 10M rows in two expired
// time buckets of a 1h class, plus 1,000 parked rows the pass must keep)
// while a consumer applies batches of 500 new events through
// inbox.Applier: the pass's time, the dead tuples left in the inbox's
// partitions, and the consumer's rate during the pass against its rate in
// the seconds before. It runs twice, each on a fresh fill: with the
// consumer applying as fast as it can (it and its PostgreSQL backend then
// keep both of this machine's cores busy, so the pass's own CPU comes out
// of the consumer's share), and with the consumer offered half of that
// rate (what a consumer with headroom sees: whether the pass blocks it).
func BenchmarkRetention(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	full := retentionPass(b, benchReport, sz.RetentionRows, 5*time.Second, 0)
	retentionPass(b, benchReport, sz.RetentionRows, 5*time.Second, full/2)
}

const retentionPolicy = `{"classes": [{"match": "bench.old", "keep": "1h"}, {"match": "*", "keep": "720h"}]}`

// retentionPass fills, then times one pass while the consumer applies at
// pace events/s (0: as fast as it can), and returns the consumer's rate
// before the pass.
func retentionPass(tb testing.TB, rep *report, rows int, before time.Duration, pace float64) float64 {
	ctx := context.Background()
	db := testkit.NewDB(tb)
	exec := func(q string, args ...any) {
		tb.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
	policy, err := retention.Parse([]byte(retentionPolicy))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := retention.Prune(ctx, db.Pool, policy, retention.Options{}); err != nil { // publishes the classes
		tb.Fatal(err)
	}
	var lane string
	if err := db.Pool.QueryRow(ctx, `SELECT onceflow.inbox_lane('default', 'bench.old')`).Scan(&lane); err != nil {
		tb.Fatal(err)
	}
	// Two expired buckets (5 and 4 hours ago), filled half and half.
	exec(`SELECT onceflow.inbox_ensure_buckets('default', $1, now() - interval '5 hours')`, lane)
	t0 := time.Now()
	exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, lane, event_at, received_at)
		SELECT 'default', 'old-' || g, 'old-' || (g % 100000), g / 100000 + 1, 'bench.old', 'old', g % 4, g, 'processed', now(), $2,
		       now() - interval '5 hours' + (g % 2) * interval '1 hour', now() - interval '5 hours'
		  FROM generate_series(1, $1::bigint) g`, rows, lane)
	exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at, received_at, headers, payload)
		SELECT 'default', 'parked-' || g, 'parked', g + 1, 'bench.old', 'old', 0, g, 'parked', $1,
		       now() - interval '5 hours', now() - interval '5 hours', '{}', '\x00'
		  FROM generate_series(1, 1000) g`, lane)
	fill := time.Since(t0)
	exec(`VACUUM ANALYZE onceflow.inbox`)
	exec(`CHECKPOINT`)
	// Every row here was written under the constraint inbox_id_time (the
	// filled ids are not UUIDv7s): as in an install older than one
	// retention period, no bucket is read for rows from before it.
	exec(`UPDATE onceflow.inbox_id_time SET since = '-infinity'`)

	// The consumer: batches of 500 new events of a 720h type, in order.
	app, err := inbox.NewApplier(inbox.Config{Pool: db.Pool, Group: "bench", ConsumerName: "default",
		Handler: inbox.HandlerFunc(func(context.Context, pgx.Tx, inbox.Event) error { return nil })})
	if err != nil {
		tb.Fatal(err)
	}
	var applied atomic.Int64
	var log batchLog
	// The slowest batch since the last reset, and (paced) how far the
	// consumer fell behind its schedule, in nanoseconds.
	var slowest, behind atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var applyErr error
	wg.Go(func() {
		seq := int64(0)
		start := time.Now()
		for {
			if pace > 0 {
				due := start.Add(time.Duration(float64(seq) / pace * float64(time.Second)))
				if late := time.Since(due); late < 0 {
					time.Sleep(-late)
				} else if int64(late) > behind.Load() {
					behind.Store(int64(late))
				}
			}
			select {
			case <-stop:
				return
			default:
			}
			recs := make([]*kgo.Record, 500)
			for i := range recs {
				seq++
				ev := envelope.Envelope{EventID: outbox.NewEventID(), Source: "live", Seq: seq, EventType: "bench.live", Payload: []byte(`{}`)}
				recs[i] = ev.Record("live")
				recs[i].Offset = seq
			}
			t0 := time.Now()
			res, err := app.Apply(ctx, recs...)
			if err != nil {
				applyErr = err
				return
			}
			t1 := time.Now()
			if d := int64(t1.Sub(t0)); d > slowest.Load() {
				slowest.Store(d)
			}
			applied.Add(int64(res.Processed))
			log.add(t0, t1, res.Processed)
		}
	})
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	// Warm up, then the rate before the pass.
	for applied.Load() < 2000 && applyErr == nil {
		time.Sleep(10 * time.Millisecond)
	}
	pm := postmasterPid(tb, db.Pool)
	cpu := func() (self, server float64) {
		if pm == 0 {
			return cpuOf(os.Getpid()), math.NaN()
		}
		return cpuOf(os.Getpid()), cpuTree(pm)
	}
	slowest.Store(0)
	behind.Store(0)
	tb0 := time.Now()
	self0, server0 := cpu()
	time.Sleep(before)
	tb1 := time.Now()
	self1, server1 := cpu()
	slowBefore, behindBefore := time.Duration(slowest.Swap(0)), time.Duration(behind.Swap(0))

	record := rep.measure()
	st, err := retention.Prune(ctx, db.Pool, policy, retention.Options{})
	t2 := time.Now()
	took := t2.Sub(tb1)
	// A paced consumer applies a batch every 500/pace seconds: its rate
	// is taken over at least the 2 s from the pass's start (a delay the
	// pass causes shows there, or as the time behind schedule).
	window := took
	if pace > 0 && window < 2*time.Second {
		time.Sleep(2*time.Second - window)
		window = 2 * time.Second
	}
	self2, server2 := cpu()
	slowDuring, behindDuring := time.Duration(slowest.Load()), time.Duration(behind.Load())
	// The batch in flight at either end of the window counts in part.
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	if err != nil {
		tb.Fatal(err)
	}
	if applyErr != nil {
		tb.Fatal(applyErr)
	}
	beforeRate := log.eventsIn(tb0, tb1) / tb1.Sub(tb0).Seconds()
	during := log.eventsIn(tb1, tb1.Add(window))
	duringRate := during / window.Seconds()
	lost := window - time.Duration(during/beforeRate*float64(time.Second))
	var left int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.inbox WHERE event_id LIKE 'old-%'`).Scan(&left); err != nil || left != 0 || st.InboxBuckets != 2 {
		tb.Fatalf("%d expired rows left (%v), %d buckets removed (%+v); want none left, 2 removed", left, err, st.InboxBuckets, st)
	}
	var kept int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.inbox WHERE event_id LIKE 'parked-%' AND status = 'parked'`).Scan(&kept); err != nil || kept != 1000 {
		tb.Fatalf("%d parked rows kept (%v), want 1000", kept, err)
	}
	// The statistics of other sessions reach pg_stat after their next flush
	// (at most a second after their transaction when idle).
	time.Sleep(1500 * time.Millisecond)
	var dead int64
	if err := db.Pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
		WHERE schemaname = 'onceflow' AND (relname LIKE 'inbox\_b\_%' OR relname IN ('inbox_legacy', 'inbox_default'))`).Scan(&dead); err != nil {
		tb.Fatal(err)
	}
	how := "the consumer as fast as it goes"
	if pace > 0 {
		how = fmt.Sprintf("the consumer offered %.0f events/s", pace)
	}
	cores := func(self, server, secs float64) string {
		return fmt.Sprintf("%.2f + %.2f", self/secs, server/secs)
	}
	record(figure{Name: fmt.Sprintf("retention: a pass expiring %d inbox rows (2 buckets), %s", rows, how), Value: took.Seconds(), Unit: "s",
		Target: "<= 5 s, n_dead_tup 0", Met: met(took <= 5*time.Second && dead == 0),
		Notes: []string{fmt.Sprintf("n_dead_tup after: %d; 1000 parked rows moved to the legacy partition; buckets removed %d; fill %s (not timed)",
			dead, st.InboxBuckets, fill.Round(time.Second))}})
	name := "retention: consumer apply rate during the pass, as fast as it goes"
	if pace > 0 {
		name = "retention: consumer apply rate during the pass, offered half its rate"
	}
	notes := []string{fmt.Sprintf("inbox.Applier, batches of 500 UUIDv7 ids (outbox.NewEventID), no-op handler; %.0f events in the %s from the pass's start (a batch at either end counted by the share of its time inside), the consumer's time lost to the pass %s",
		during, window.Round(time.Millisecond), lost.Round(time.Millisecond)),
		fmt.Sprintf("cores busy (this process + every PostgreSQL process), before: %s, during the pass: %s, of 2",
			cores(self1-self0, server1-server0, tb1.Sub(tb0).Seconds()), cores(self2-self1, server2-server1, window.Seconds())),
		fmt.Sprintf("slowest batch before %s, during %s", slowBefore.Round(time.Millisecond), slowDuring.Round(time.Millisecond))}
	if pace > 0 {
		notes = append(notes, fmt.Sprintf("furthest behind its schedule before %s, during %s", behindBefore.Round(time.Millisecond), behindDuring.Round(time.Millisecond)))
	}
	record(figure{Name: name, Value: duringRate, Unit: "events/s",
		CeilingName: fmt.Sprintf("the %s before", before), Ceiling: beforeRate, Target: "ratio >= 0.9", Met: met(duringRate >= 0.9*beforeRate),
		Notes: notes})
	return beforeRate
}

// batchLog records a consumer's batches, each with its start, end and
// events, so that the events of a window count a batch crossing its edge
// by the share of the batch's time inside: a pass of half a second holds
// some 25 batches, and counting whole ones moved the rate by 4 %.
type batchLog struct {
	mu    sync.Mutex
	spans []batchSpan
}

type batchSpan struct {
	start, end time.Time
	n          int
}

func (l *batchLog) add(start, end time.Time, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spans = append(l.spans, batchSpan{start, end, n})
}

// eventsIn is the events applied from t0 to t1.
func (l *batchLog) eventsIn(t0, t1 time.Time) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var sum float64
	for _, s := range l.spans {
		from, to := s.start, s.end
		if from.Before(t0) {
			from = t0
		}
		if to.After(t1) {
			to = t1
		}
		if d := s.end.Sub(s.start); to.After(from) && d > 0 {
			sum += float64(s.n) * float64(to.Sub(from)) / float64(d)
		}
	}
	return sum
}
