package reconcile

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// record is what reconcile needs of one data record.
type record struct {
	topic     string
	partition int32
	offset    int64
	rec       *kgo.Record
}

// readTopics reads every partition of topics with read_committed, from the
// first record whose timestamp is at or after since to the last stable
// offset listed when it starts, and hands each data record to each, in
// offset order per partition. Control records (transaction markers) count
// toward the positions but are not handed on.
func readTopics(ctx context.Context, opts []kgo.Opt, topics []string, since time.Time, each func(record) error) (read int64, err error) {
	acl, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	adm := kadm.NewClient(acl)
	defer adm.Close()
	starts, err := adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("list the offsets of %v at %s: %w", topics, since.UTC().Format(time.RFC3339), err)
	}
	ends, err := adm.ListCommittedOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("list the last stable offsets of %v: %w", topics, err)
	}
	for _, t := range topics {
		if _, ok := ends[t]; !ok {
			return 0, fmt.Errorf("topic %s: not found", t)
		}
	}
	assign := map[string]map[int32]kgo.Offset{}
	want := map[string]map[int32]int64{} // the last offset to read
	ends.Each(func(o kadm.ListedOffset) {
		start := o.Offset
		if s, ok := starts.Lookup(o.Topic, o.Partition); ok {
			start = s.Offset
		}
		if start >= o.Offset {
			return
		}
		if assign[o.Topic] == nil {
			assign[o.Topic] = map[int32]kgo.Offset{}
			want[o.Topic] = map[int32]int64{}
		}
		assign[o.Topic][o.Partition] = kgo.NewOffset().At(start)
		want[o.Topic][o.Partition] = o.Offset - 1
	})
	if len(assign) == 0 {
		return 0, nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.ConsumePartitions(assign),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	}, opts...)...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	left := 0
	for _, ps := range want {
		left += len(ps)
	}
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if cerr := ctx.Err(); cerr != nil {
			return read, fmt.Errorf("read %v to the last stable offsets: %w", topics, cerr)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				ferr = fmt.Errorf("fetch %s[%d]: %w", t, p, err)
			}
		})
		if ferr != nil {
			return read, ferr
		}
		var herr error
		fs.EachRecord(func(r *kgo.Record) {
			last, ok := want[r.Topic][r.Partition]
			if !ok || herr != nil {
				return
			}
			if r.Offset >= last {
				// Done: at the last offset, or past it (the records
				// just before it belonged to an aborted transaction).
				delete(want[r.Topic], r.Partition)
				left--
				if r.Offset > last {
					return
				}
			}
			if r.Attrs.IsControl() {
				return
			}
			read++
			herr = each(record{topic: r.Topic, partition: r.Partition, offset: r.Offset, rec: r})
		})
		if herr != nil {
			return read, herr
		}
	}
	return read, nil
}
