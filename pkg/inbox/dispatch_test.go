package inbox

import (
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"
)

func offsets(from, to int64) []*kgo.Record {
	var out []*kgo.Record
	for o := from; o <= to; o++ {
		out = append(out, &kgo.Record{Topic: "t", Partition: 1, Offset: o})
	}
	return out
}

// TestDispatchNeverReachesALaterWorker is the stale-fetch scenario, step by
// step: partition 0 is stuck in retry backoff, a poll returns partition 1's
// records 200-299, and before they are dispatched partition 1 is revoked
// and assigned to this member again (its new worker starts at 150, the
// committed offset). The polled batch must not reach the new worker:
// applied there before 150-199, it would store the next offset 300 and a
// crash would lose 150-199. A poll made after the reassignment reaches it.
func TestDispatchNeverReachesALaterWorker(t *testing.T) {
	t.Parallel()
	c := &Consumer{cfg: Config{QueueDepth: 2}, m: mustMetrics(t), log: slog.New(slog.DiscardHandler), workers: map[tp]*worker{}}
	c.addWorkers(map[string][]int32{"t": {0, 1}})
	stuck := c.workers[tp{"t", 0}]
	gen := pollGen(c)
	polledBefore := []polledPartition{{tp: tp{"t", 1}, recs: offsets(200, 299)}}

	old := c.takeWorkers(map[string][]int32{"t": {1}}) // revoked
	c.addWorkers(map[string][]int32{"t": {1}})         // and assigned to this member again
	fresh := c.workers[tp{"t", 1}]
	if len(old) != 1 || old[0] == fresh {
		t.Fatal("the reassignment did not make a new worker")
	}
	c.dispatch(gen, polledBefore)
	if len(fresh.queue) != 0 || len(old[0].queue) != 0 {
		t.Fatalf("a batch polled before the reassignment was dispatched: new worker %d, old %d batches", len(fresh.queue), len(old[0].queue))
	}
	if got := testutil.ToFloat64(c.m.staleBatches); got != 1 {
		t.Fatalf("stale_batches_dropped_total = %v, want 1", got)
	}

	c.dispatch(pollGen(c), []polledPartition{{tp: tp{"t", 1}, recs: offsets(150, 199)}, {tp: tp{"t", 0}, recs: offsets(7, 9)}})
	f, ok := fresh.next(nil, 2, 500)
	if !ok || f.recs[0].Offset != 150 || f.gen < fresh.gen {
		t.Fatalf("the new worker's first batch: %+v %v", f, ok)
	}
	if len(stuck.queue) != 1 {
		t.Fatalf("the stuck partition's worker has %d batches queued, want 1", len(stuck.queue))
	}
	// Without blocking: more batches queue past QueueDepth (with a client,
	// fetching of the partition is paused meanwhile).
	for range 3 {
		c.dispatch(pollGen(c), []polledPartition{{tp: tp{"t", 0}, recs: offsets(10, 12)}})
	}
	if len(stuck.queue) != 4 {
		t.Fatalf("%d batches queued for the stuck partition, want 4", len(stuck.queue))
	}
}

func mustMetrics(t *testing.T) *metrics {
	t.Helper()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestNextMergesQueuedBatches: the batches that waited for a busy worker are
// taken together, in offset order, up to BatchMaxRecords records; a batch
// polled under another assignment or from another topic ID is never merged
// with them, and the polled slices are not written to.
func TestNextMergesQueuedBatches(t *testing.T) {
	t.Parallel()
	w := newWorker(tp{"t", 1}, 1)
	first := append(make([]*kgo.Record, 0, 8), offsets(0, 2)...) // room to append in place
	w.queue = []fetched{
		{recs: first, hw: 10, gen: 1},
		{recs: offsets(3, 5), hw: 11, gen: 1},
		{recs: offsets(6, 8), hw: 12, gen: 1},
		{recs: offsets(9, 9), hw: 13, gen: 1, topicID: [16]byte{1}},
		{recs: offsets(10, 10), hw: 14, gen: 2, topicID: [16]byte{1}},
	}
	want := func(f fetched, ok bool, from, to, hw int64) {
		t.Helper()
		if !ok || len(f.recs) != int(to-from+1) || f.hw != hw {
			t.Fatalf("got %d records (ok %v, hw %d), want %d-%d with hw %d", len(f.recs), ok, f.hw, from, to, hw)
		}
		for i, r := range f.recs {
			if r.Offset != from+int64(i) {
				t.Fatalf("record %d has offset %d, want %d", i, r.Offset, from+int64(i))
			}
		}
	}
	f, ok := w.next(nil, 2, 8) // 3 + 3 fit in 8, the third batch does not
	want(f, ok, 0, 5, 11)
	if first[:4][3] != nil {
		t.Fatal("the polled slice was written to")
	}
	f, ok = w.next(nil, 2, 500) // another topic ID follows
	want(f, ok, 6, 8, 12)
	f, ok = w.next(nil, 2, 500) // another assignment follows
	want(f, ok, 9, 9, 13)
	f, ok = w.next(nil, 2, 500)
	want(f, ok, 10, 10, 14)
	if _, ok := w.next(nil, 2, 500); ok {
		t.Fatal("a batch from an empty queue")
	}
}
