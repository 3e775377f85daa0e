package relay

// Reading and keeping the checkpoint topic: the topic is made compacted if
// missing, and the last committed record under a key is read back at
// recovery (read_committed, to the partition's measured end).

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ensureCheckpointTopic creates the compacted checkpoint topic if missing.
func ensureCheckpointTopic(ctx context.Context, cl *kgo.Client, topic string) error {
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("describe checkpoint topic %q: %w", topic, err)
	}
	if t, ok := td[topic]; ok && t.Err == nil {
		return nil
	}
	brokers, err := adm.ListBrokers(ctx)
	if err != nil {
		return fmt.Errorf("list brokers: %w", err)
	}
	rf := int16(min(3, len(brokers)))
	resp, err := adm.CreateTopic(ctx, 1, rf, map[string]*string{
		"cleanup.policy":      new("compact"),
		"min.insync.replicas": new(strconv.Itoa(max(1, int(rf)-1))),
	}, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("create checkpoint topic %q: %w", topic, err)
	}
	return nil
}

// lastCheckpoint returns the newest committed record with key on topic, or
// nil when there is none. It never guesses (invariant I2): it measures each
// partition's log start and high watermark, then reads backwards from the
// latter in growing windows, each window to its end, so it touches only the
// tail of the topic. "None" is only concluded once every partition was read
// from its log start to the measured end without finding key; a partition
// that does not answer is an error (the caller retries with backoff), never
// an empty answer.
//
// It reads read_uncommitted and decides itself which of its records
// committed, from the transaction markers (control records) of their
// producer: on a checkpoint topic shared with other databases' relays, one of
// them may hold a transaction open that began before our last commit, and a
// read_committed reader stops at that transaction's first record (the last
// stable offset), which would hide our commit. Call it after the producer
// has initialised the transactional id that writes key: that completes or
// aborts its pending transaction, so every record with key below the high
// watermark then has its marker below it too.
func lastCheckpoint(ctx context.Context, opts []kgo.Opt, topic, key string) (*kgo.Record, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("checkpoint reader: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("checkpoint topic %q metadata: %w", topic, err)
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil {
		return nil, fmt.Errorf("checkpoint topic %q metadata: %v", topic, td.Err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list end offsets of %q: %w", topic, err)
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list start offsets of %q: %w", topic, err)
	}
	var best *kgo.Record
	for _, p := range td.Partitions.Sorted() {
		end, ok1 := ends.Lookup(topic, p.Partition)
		start, ok2 := starts.Lookup(topic, p.Partition)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("checkpoint topic %q partition %d: offsets not listed", topic, p.Partition)
		}
		pr := partitionReader{cl: cl, topic: topic, topicID: td.ID, partition: p.Partition, leader: p.Leader}
		r, err := pr.lastCommitted(ctx, start.Offset, end.Offset, key)
		if err != nil {
			return nil, err
		}
		if r != nil && (best == nil || r.Timestamp.After(best.Timestamp)) {
			best = r
		}
	}
	return best, nil
}

// partitionReader fetches one partition with raw Fetch requests, so that it
// knows exactly which offset it has read up to (the client's consumer hides
// that: a read that brings no record could be a slow broker or an empty
// range).
type partitionReader struct {
	cl        *kgo.Client
	topic     string
	topicID   [16]byte
	partition int32
	leader    int32
}

// txnMarker is a transaction's end, as written into the partition.
type txnMarker struct {
	offset int64
	commit bool
}

// lastCommitted reads [start, end) backwards in growing windows and returns
// the last record with key whose transaction committed (or that was written
// outside a transaction), or nil when the range holds none.
func (p partitionReader) lastCommitted(ctx context.Context, start, end int64, key string) (*kgo.Record, error) {
	markers := map[int64][]txnMarker{} // producer id -> markers seen so far, sorted by offset
	hi := end
	for window := int64(64); hi > start; window *= 4 {
		lo := max(start, hi-window)
		var candidates []*kgo.Record
		err := p.read(ctx, lo, hi, func(r *kgo.Record) {
			switch {
			case r.Attrs.IsControl():
				// The key of a control record: int16 version, int16 type
				// (0 abort, 1 commit).
				if len(r.Key) >= 4 {
					markers[r.ProducerID] = append(markers[r.ProducerID], txnMarker{offset: r.Offset, commit: r.Key[3] == 1})
				}
			case string(r.Key) == key:
				candidates = append(candidates, r)
			}
		})
		if err != nil {
			return nil, err
		}
		for pid := range markers {
			slices.SortFunc(markers[pid], func(a, b txnMarker) int { return cmp.Compare(a.offset, b.offset) })
		}
		for i := len(candidates) - 1; i >= 0; i-- {
			r := candidates[i]
			if !r.Attrs.IsTransactional() {
				return r, nil
			}
			ms := markers[r.ProducerID]
			j, _ := slices.BinarySearchFunc(ms, r.Offset, func(m txnMarker, off int64) int { return cmp.Compare(m.offset, off+1) })
			if j == len(ms) {
				return nil, fmt.Errorf("checkpoint record %s[%d]@%d: its transaction (producer id %d) is not decided below the end measured (%d)",
					p.topic, p.partition, r.Offset, r.ProducerID, end)
			}
			if ms[j].commit {
				return r, nil
			}
		}
		hi = lo
	}
	return nil, nil
}

// read reads [lo, hi) read_uncommitted, control records included, to its
// end, calling visit for each record. Every fetch moves forward (hi is at
// most the high watermark); one that does not is an error.
func (p partitionReader) read(ctx context.Context, lo, hi int64, visit func(*kgo.Record)) error {
	if p.leader < 0 {
		return fmt.Errorf("topic %q partition %d has no leader", p.topic, p.partition)
	}
	dec := kgo.DefaultDecompressor()
	for off := lo; off < hi; {
		req := kmsg.NewPtrFetchRequest()
		req.MaxWaitMillis = 500
		req.MinBytes = 1
		req.MaxBytes = 32 << 20
		req.IsolationLevel = 0 // read_uncommitted: lastCommitted decides from the markers
		t := kmsg.NewFetchRequestTopic()
		t.Topic, t.TopicID = p.topic, p.topicID
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes = p.partition, off, 16<<20
		t.Partitions = append(t.Partitions, fp)
		req.Topics = append(req.Topics, t)
		resp, err := req.RequestWith(ctx, p.cl.Broker(int(p.leader)))
		if err != nil {
			return fmt.Errorf("read %s[%d] at offset %d: %w", p.topic, p.partition, off, err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return fmt.Errorf("read %s[%d] at offset %d: %w", p.topic, p.partition, off, err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return fmt.Errorf("read %s[%d] at offset %d: unexpected fetch response shape", p.topic, p.partition, off)
		}
		rp := &resp.Topics[0].Partitions[0]
		part, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
			KeepControlRecords: true,
			Offset:             off,
			IsolationLevel:     kgo.ReadUncommitted(),
			Topic:              p.topic,
			Partition:          p.partition,
		}, rp, dec, nil)
		if part.Err != nil {
			return fmt.Errorf("read %s[%d] at offset %d: %w", p.topic, p.partition, off, part.Err)
		}
		for _, r := range part.Records {
			if r.Offset >= lo && r.Offset < hi {
				visit(r)
			}
		}
		if next <= off {
			return fmt.Errorf("read %s[%d]: no progress at offset %d (high watermark %d, reading up to %d)",
				p.topic, p.partition, off, part.HighWatermark, hi)
		}
		off = next
	}
	return nil
}
