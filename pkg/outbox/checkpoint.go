package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The checkpoint value names a batch's outbox ids compactly as ranges:
// "v1 12-40,44,51-90". A batch of polled rows is mostly one range.
const checkpointVersion = "v1 "

func encodeIDs(ids []int64) []byte {
	s := slices.Clone(ids)
	slices.Sort(s)
	b := []byte(checkpointVersion)
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] <= s[j]+1 {
			j++
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, s[i], 10)
		if s[j] != s[i] {
			b = append(b, '-')
			b = strconv.AppendInt(b, s[j], 10)
		}
		i = j + 1
	}
	return b
}

// maxCheckpointIDs guards decoding against a corrupt range.
const maxCheckpointIDs = 1 << 20

func decodeIDs(v []byte) ([]int64, error) {
	s, ok := strings.CutPrefix(string(v), checkpointVersion)
	if !ok {
		return nil, fmt.Errorf("checkpoint %q: unknown version", truncate(string(v), 40))
	}
	var ids []int64
	if s == "" {
		return ids, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseInt(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("checkpoint range %q: %v", part, err)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseInt(hi, 10, 64); err != nil || b < a {
				return nil, fmt.Errorf("checkpoint range %q is invalid", part)
			}
		}
		if int64(len(ids))+b-a+1 > maxCheckpointIDs {
			return nil, fmt.Errorf("checkpoint names over %d ids", maxCheckpointIDs)
		}
		for id := a; id <= b; id++ {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

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

// readCheckpoint returns the ids of the last committed checkpoint of shard,
// or nil when there is none. It reads read_committed backwards from the last
// stable offset of each partition in growing windows, so it touches only the
// tail of the topic. Call it after the producer has initialised its
// transactional id: that completes or aborts this shard's pending
// transaction, so the last stable offset is past our last commit.
func readCheckpoint(ctx context.Context, opts []kgo.Opt, topic, shard string) ([]int64, error) {
	admCl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	lso, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("list checkpoint offsets: %w", err)
	}
	if err := lso.Error(); err != nil {
		return nil, fmt.Errorf("list checkpoint offsets of %q: %w", topic, err)
	}
	var best *kgo.Record
	var firstErr error
	lso.Each(func(o kadm.ListedOffset) {
		if firstErr != nil || o.Offset <= 0 {
			return
		}
		start := o.Offset
		for window := int64(64); start > 0; window *= 4 {
			end := start
			start = max(0, end-window)
			r, err := lastKeyed(ctx, opts, topic, o.Partition, start, end, shard)
			if err != nil {
				firstErr = err
				return
			}
			if r != nil {
				if best == nil || r.Timestamp.After(best.Timestamp) {
					best = r
				}
				return
			}
		}
	})
	if firstErr != nil {
		return nil, firstErr
	}
	if best == nil {
		return nil, nil
	}
	return decodeIDs(best.Value)
}

// lastKeyed reads [start, end) of one partition read_committed and returns
// the last record with key shard.
func lastKeyed(ctx context.Context, opts []kgo.Opt, topic string, partition int32, start, end int64, shard string) (*kgo.Record, error) {
	cl, err := kgo.NewClient(append(slices.Clone(opts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(start)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var last *kgo.Record
	idle := 0
	for {
		// Every offset below the last stable offset is decided, so reading
		// ends at the record at end-1. Aborted records are filtered by the
		// broker, so a poll that brings nothing new for a while ends it too.
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = err
			}
		})
		if ferr != nil {
			return nil, fmt.Errorf("read checkpoint topic %q: %w", topic, ferr)
		}
		n, done := 0, false
		fs.EachRecord(func(r *kgo.Record) {
			n++
			if r.Offset >= end-1 {
				done = true
			}
			if r.Offset < end && !r.Attrs.IsControl() && string(r.Key) == shard {
				last = r
			}
		})
		if done {
			return last, nil
		}
		if n == 0 {
			if idle++; idle >= 4 {
				return last, nil
			}
		}
	}
}
