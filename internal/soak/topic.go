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

// topicWatch reads the event topic with read_committed for the whole run
// (past the proxies), so that the final check only reads the tail: every
// event's copies, each source's order, and where each first copy sits.
type topicWatch struct {
	r *audit.TopicReader

	mu        sync.Mutex
	seq       *audit.Sequence
	first     map[string]pos
	malformed []string
	dupes     []string // "id at p/o, first at p/o"
	reordered []string // "source: seq a after seq b at p/o"
	// The event ids of dupes and reordered, for the per-fault table.
	dupeIDs, reorderedIDs []string
	partitions            map[int32]int64

	seen     atomic.Int64
	pollErrs atomic.Int64
	lastErr  atomic.Pointer[string]
}

type pos struct {
	partition int32
	offset    int64
}

func (p pos) String() string { return fmt.Sprintf("%d/%d", p.partition, p.offset) }

// newTopicTally is a topicWatch without a reader: fed by add.
func newTopicTally() *topicWatch {
	return &topicWatch{seq: audit.NewSequence(), first: map[string]pos{}, partitions: map[int32]int64{}}
}

func newTopicWatch(topic string, opts []kgo.Opt) (*topicWatch, error) {
	w := newTopicTally()
	r, err := audit.NewTopicReader(topic, w.add, opts...)
	if err != nil {
		return nil, err
	}
	w.r = r
	return w, nil
}

func (w *topicWatch) add(rec audit.Record) {
	w.seen.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	at := pos{rec.Partition, rec.Offset}
	w.partitions[rec.Partition]++
	if rec.Err != nil {
		w.malformed = append(w.malformed, fmt.Sprintf("%s: %v", at, rec.Err))
		return
	}
	e := rec.Env
	if w.seq.Add(e.EventID, e.Source, e.Seq) {
		w.reordered = append(w.reordered, fmt.Sprintf("%s: seq %d (%s) at %s after seq %d", e.Source, e.Seq, e.EventID, at, w.seq.LastSeq(e.Source)))
		w.reorderedIDs = append(w.reorderedIDs, e.EventID)
	}
	if f, ok := w.first[e.EventID]; ok {
		w.dupes = append(w.dupes, fmt.Sprintf("%s (%s seq %d) at %s, first at %s", e.EventID, e.Source, e.Seq, at, f))
		w.dupeIDs = append(w.dupeIDs, e.EventID)
	} else {
		w.first[e.EventID] = at
	}
}

// run polls until ctx ends.
func (w *topicWatch) run(ctx context.Context) {
	for ctx.Err() == nil {
		if err := w.r.Poll(ctx); err != nil && ctx.Err() == nil {
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
