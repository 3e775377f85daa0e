package soak

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/audit"
)

// topicWatch reads the event topics with read_committed for the whole run
// (past the proxies), so that the final check only reads the tail: every
// event's copies, each stream's order (producer, topic, source), and where
// each first copy sits.
type topicWatch struct {
	readers []*audit.TopicReader

	mu        sync.Mutex
	seq       *audit.Sequence
	first     map[string]pos
	malformed []string
	dupes     []string // "id at p/o, first at p/o"
	reordered []string // "source: seq a after seq b at p/o"
	// The event ids of dupes and reordered, for the per-fault table.
	dupeIDs, reorderedIDs []string
	partitions            map[int32]int64
	// producers names the producing databases by their identity (the
	// records' producer header), set before the readers start.
	producers map[string]string

	seen     atomic.Int64
	pollErrs atomic.Int64
	lastErr  atomic.Pointer[string]
}

type pos struct {
	topic     string
	partition int32
	offset    int64
}

func (p pos) String() string {
	if p.topic == "" {
		return fmt.Sprintf("%d/%d", p.partition, p.offset)
	}
	return fmt.Sprintf("%s/%d/%d", p.topic, p.partition, p.offset)
}

// newTopicTally is a topicWatch without a reader: fed by add.
func newTopicTally() *topicWatch {
	return &topicWatch{seq: audit.NewSequence(), first: map[string]pos{}, partitions: map[int32]int64{}}
}

func newTopicWatch(topics []string, opts []kgo.Opt) (*topicWatch, error) {
	w := newTopicTally()
	for _, topic := range topics {
		r, err := audit.NewTopicReader(topic, func(rec audit.Record) { w.addFrom(topic, rec) }, opts...)
		if err != nil {
			w.close()
			return nil, err
		}
		w.readers = append(w.readers, r)
	}
	return w, nil
}

func (w *topicWatch) close() {
	for _, r := range w.readers {
		r.Close()
	}
}

// addFrom judges one record of topic. Its stream is the producer's
// identity (the relay's database), the topic and the source.
func (w *topicWatch) addFrom(topic string, rec audit.Record) {
	w.seen.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	at := pos{topic, rec.Partition, rec.Offset}
	w.partitions[rec.Partition]++
	if rec.Err != nil {
		w.malformed = append(w.malformed, fmt.Sprintf("%s: %v", at, rec.Err))
		return
	}
	e := rec.Env
	db := e.Producer
	if name, ok := w.producers[db]; ok {
		db = name
	}
	stream := streamKey(db, topic, e.Source)
	if topic == "" && e.Producer == "" {
		stream = e.Source
	}
	if w.seq.Add(e.EventID, stream, e.Seq) {
		w.reordered = append(w.reordered, fmt.Sprintf("%s: seq %d (%s) at %s after seq %d", stream, e.Seq, e.EventID, at, w.seq.LastSeq(stream)))
		w.reorderedIDs = append(w.reorderedIDs, e.EventID)
	}
	if f, ok := w.first[e.EventID]; ok {
		w.dupes = append(w.dupes, fmt.Sprintf("%s (%s seq %d) at %s, first at %s", e.EventID, e.Source, e.Seq, at, f))
		w.dupeIDs = append(w.dupeIDs, e.EventID)
	} else {
		w.first[e.EventID] = at
	}
}

// run polls every topic until ctx ends.
func (w *topicWatch) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range w.readers {
		wg.Add(1)
		go func() { defer wg.Done(); w.poll(ctx, r) }()
	}
	wg.Wait()
}

// readToStable reads every topic to its last stable offset.
func (w *topicWatch) readToStable(ctx context.Context) error {
	for _, r := range w.readers {
		if err := r.ReadToStable(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (w *topicWatch) poll(ctx context.Context, r *audit.TopicReader) {
	for ctx.Err() == nil {
		if err := r.Poll(ctx); err != nil && ctx.Err() == nil {
			w.pollErrs.Add(1)
			msg := err.Error()
			w.lastErr.Store(&msg)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// distinct is how many different event ids were read.
func (w *topicWatch) distinct() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.seq.Count)
}
