package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// probes measure progress end to end: every probeInterval one transaction
// enqueues an event on each probe source, one source per partition of the
// event topic, and a watcher notes when each batch has been applied. "Fault
// to progress again" is the time from a fault until the first batch begun
// after it is applied on every partition.
type probes struct {
	topic      string
	sources    []string
	partitions []int32

	mu      sync.Mutex
	batches []*probeBatch
	// applied is the highest applied seq per probe source.
	applied map[string]int64
	// latencies are commit-to-applied times of every batch, for the
	// baseline.
	latencies []time.Duration
	cond      chan struct{} // closed and replaced whenever a batch is applied
}

type probeBatch struct {
	began, committed time.Time
	seqs             map[string]int64
	applied          time.Time // zero until every event is applied
}

const probeInterval = 250 * time.Millisecond

// newProbes picks one source name per partition with the relay's
// partitioner (Kafka's murmur2 of the key, the source).
func newProbes(topic string, partitions int) *probes {
	p := &probes{topic: topic, applied: map[string]int64{}, cond: make(chan struct{})}
	tp := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	taken := map[int]bool{}
	for i := 0; len(p.sources) < partitions && i < 10000; i++ {
		src := fmt.Sprintf("probe-%d", i)
		part := tp.Partition(&kgo.Record{Key: []byte(src)}, partitions)
		if taken[part] {
			continue
		}
		taken[part] = true
		p.sources = append(p.sources, src)
		p.partitions = append(p.partitions, int32(part))
	}
	return p
}

// run writes probe batches until ctx ends.
func (p *probes) run(ctx context.Context, prod *producer, topic string) {
	rng := rand.New(rand.NewPCG(prod.seed, 4242))
	t := time.NewTicker(probeInterval)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		spec := txSpec{path: "go-batch"}
		for _, src := range p.sources {
			spec.msgs = append(spec.msgs, outbox.Message{Topic: topic, Source: src, EventType: "soak.probe",
				Payload: fmt.Appendf(nil, `{"db":%q,"probe":%d}`, prod.db, n)})
		}
		evs, began, ok := prod.do(ctx, rng, spec)
		if !ok || len(evs) == 0 {
			continue
		}
		b := &probeBatch{began: began, committed: time.Now(), seqs: map[string]int64{}}
		for _, e := range evs {
			b.seqs[e.source] = e.seq
		}
		p.mu.Lock()
		p.batches = append(p.batches, b)
		p.mu.Unlock()
	}
}

// watch polls the applied side effects of the probe sources until ctx
// ends and stamps each batch when it is applied in full.
func (p *probes) watch(ctx context.Context, pool *pgxpool.Pool) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		rows, err := pool.Query(qctx, `SELECT source, max(seq) FROM soak.effects
			WHERE consumer = $2 AND producer = $3 AND topic = $4 AND source = ANY($1) GROUP BY source`, p.sources, consumerID, dbA, p.topic)
		got := map[string]int64{}
		if err == nil {
			for rows.Next() {
				var src string
				var seq int64
				if rows.Scan(&src, &seq) == nil {
					got[src] = seq
				}
			}
			err = rows.Err()
		}
		cancel()
		if err != nil {
			continue // the database is away: a fault
		}
		now := time.Now()
		p.mu.Lock()
		for src, seq := range got {
			p.applied[src] = seq
		}
		changed := false
		for i := len(p.batches) - 1; i >= 0; i-- {
			b := p.batches[i]
			if !b.applied.IsZero() {
				break // older batches were stamped before
			}
			if p.appliedLocked(b) {
				b.applied = now
				p.latencies = append(p.latencies, now.Sub(b.committed))
				changed = true
			}
		}
		if changed {
			close(p.cond)
			p.cond = make(chan struct{})
		}
		p.mu.Unlock()
	}
}

func (p *probes) appliedLocked(b *probeBatch) bool {
	for src, seq := range b.seqs {
		if p.applied[src] < seq {
			return false
		}
	}
	return true
}

// progressAfter waits until a batch begun at or after t0 is applied in
// full and returns when that was observed; ok is false when ctx ends first.
func (p *probes) progressAfter(ctx context.Context, t0 time.Time) (time.Time, bool) {
	for {
		p.mu.Lock()
		i := sort.Search(len(p.batches), func(i int) bool { return !p.batches[i].began.Before(t0) })
		var at time.Time
		if i < len(p.batches) && !p.batches[i].applied.IsZero() {
			at = p.batches[i].applied
		}
		wake := p.cond
		p.mu.Unlock()
		if !at.IsZero() {
			return at, true
		}
		select {
		case <-ctx.Done():
			return time.Time{}, false
		case <-wake:
		case <-time.After(time.Second):
		}
	}
}

// latencySnapshot returns the commit-to-applied latencies so far.
func (p *probes) latencySnapshot() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.latencies...)
}
