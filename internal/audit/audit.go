// Package audit holds the invariant checks shared by the fault tests
// (internal/testkit's Checker), `make demo` and `make soak`: reading a topic
// with read_committed up to its last stable offset, and judging a stream of
// events (the topic's records in offset order, or the applied side effects
// in apply order) against the events that were committed: lost, duplicated,
// out of order per source, phantom.
package audit

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/envelope"
)

// Sequence judges one stream of events: how often each event id appeared
// and whether each source's seqs came in increasing order. A repeated event
// id counts as a duplicate, not as disorder.
type Sequence struct {
	// Count is how often each event id appeared.
	Count map[string]int
	// OutOfOrder lists "source: seq a after seq b" for each first
	// appearance whose seq is not above the source's highest seq so far.
	OutOfOrder []string
	// Total is the number of events added.
	Total   int
	lastSeq map[string]int64
}

// NewSequence returns an empty Sequence.
func NewSequence() *Sequence {
	return &Sequence{Count: map[string]int{}, lastSeq: map[string]int64{}}
}

// Add records one appearance and reports whether it broke the source's
// order (a first appearance at or below the highest seq seen).
func (s *Sequence) Add(eventID, source string, seq int64) (outOfOrder bool) {
	s.Total++
	s.Count[eventID]++
	prev, ok := s.lastSeq[source]
	if ok && seq <= prev && s.Count[eventID] == 1 {
		s.OutOfOrder = append(s.OutOfOrder, fmt.Sprintf("%s: seq %d after seq %d", source, seq, prev))
		outOfOrder = true
	}
	if !ok || seq > prev {
		s.lastSeq[source] = seq
	}
	return outOfOrder
}

// LastSeq is the highest seq seen for source (0 if none).
func (s *Sequence) LastSeq(source string) int64 { return s.lastSeq[source] }

// Diff compares the stream with the committed event ids: lost (committed,
// never seen), duplicated (seen more than once) and phantom (seen, never
// committed). Each list is sorted.
func (s *Sequence) Diff(committed map[string]bool) (lost, duplicated, phantom []string) {
	for id := range committed {
		if s.Count[id] == 0 {
			lost = append(lost, id)
		}
	}
	for id, n := range s.Count {
		if n > 1 {
			duplicated = append(duplicated, id)
		}
		if !committed[id] {
			phantom = append(phantom, id)
		}
	}
	sort.Strings(lost)
	sort.Strings(duplicated)
	sort.Strings(phantom)
	return lost, duplicated, phantom
}

// Record is one data record read from the topic: its envelope, or the
// reason it is not one.
type Record struct {
	Partition int32
	Offset    int64
	Env       envelope.Envelope
	// Err is set when the record does not decode as an envelope.
	Err error
}

// TopicReader reads a topic from its start with read_committed and hands
// each data record to OnRecord, in offset order per partition. Control
// records (transaction markers) are counted in the positions but not handed
// on.
type TopicReader struct {
	Topic    string
	OnRecord func(Record)
	// View, when set, turns each data record into the one read as an
	// envelope, e.g. a wire-format record into its JSON view
	// (wire.Decoder.View); its error is the Record's Err.
	View func(context.Context, *kgo.Record) (*kgo.Record, error)

	cl   *kgo.Client
	adm  *kadm.Client
	last map[int32]int64 // partition -> last offset read (control records included)
}

// NewTopicReader connects with opts (seed brokers and any security
// options) and starts at the beginning of topic.
func NewTopicReader(topic string, onRecord func(Record), opts ...kgo.Opt) (*TopicReader, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	}, opts...)...)
	if err != nil {
		return nil, err
	}
	acl, err := kgo.NewClient(opts...)
	if err != nil {
		cl.Close()
		return nil, err
	}
	return &TopicReader{Topic: topic, OnRecord: onRecord, cl: cl, adm: kadm.NewClient(acl), last: map[int32]int64{}}, nil
}

// Close closes the clients.
func (r *TopicReader) Close() {
	r.cl.Close()
	r.adm.Close()
}

// Poll reads what one fetch returns (waiting for it up to ctx) and hands
// it on. A fetch error other than ctx ending is returned; the reader stays
// usable.
func (r *TopicReader) Poll(ctx context.Context) error {
	fs := r.cl.PollFetches(ctx)
	var ferr error
	fs.EachError(func(_ string, _ int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && ferr == nil {
			ferr = err
		}
	})
	fs.EachRecord(func(rec *kgo.Record) {
		r.last[rec.Partition] = rec.Offset
		if rec.Attrs.IsControl() {
			return
		}
		var env envelope.Envelope
		view, err := rec, error(nil)
		if r.View != nil {
			view, err = r.View(ctx, rec)
		}
		if err == nil {
			env, err = envelope.Decode(view, 0)
		}
		if r.OnRecord != nil {
			r.OnRecord(Record{Partition: rec.Partition, Offset: rec.Offset, Env: env, Err: err})
		}
	})
	return ferr
}

// ReadToStable reads until every partition is read up to the last stable
// offset measured when it was called: what read_committed can see now.
func (r *TopicReader) ReadToStable(ctx context.Context) error {
	lso, err := r.adm.ListCommittedOffsets(ctx, r.Topic)
	if err != nil {
		return err
	}
	if err := lso.Error(); err != nil {
		return err
	}
	done := func() bool {
		ok := true
		lso.Each(func(o kadm.ListedOffset) {
			if o.Offset > 0 {
				if last, seen := r.last[o.Partition]; !seen || last < o.Offset-1 {
					ok = false
				}
			}
		})
		return ok
	}
	for !done() {
		err := r.Poll(ctx)
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("read %s to its last stable offset: %w", r.Topic, cerr)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
