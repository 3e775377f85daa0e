package admin

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// PartitionLag is one partition's position.
type PartitionLag struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// EndOffset is the partition's last stable offset: the end a
	// read_committed reader can reach (Kafka; nil when unknown).
	EndOffset   *int64 `json:"end_offset"`
	StartOffset *int64 `json:"start_offset"`
	// StoredNextOffset is the next offset stored in
	// onceflow.consumer_offsets in the same transaction as the events
	// before it: what is applied (nil before the first batch).
	StoredNextOffset *int64     `json:"stored_next_offset"`
	StoredAt         *time.Time `json:"stored_at"`
	// KafkaCommitted is the group's committed offset in Kafka (it trails
	// the stored one by up to a commit interval).
	KafkaCommitted *int64 `json:"kafka_committed"`
	// Lag is how many events lie between the applied position (the stored
	// next offset; before the first batch, the Kafka committed offset, or
	// else the start offset) and EndOffset. Up to markerCheckMax offsets
	// behind, the records there are read (read_committed) and commit
	// markers are not counted; further behind it is the offset difference.
	Lag *int64 `json:"lag"`
}

// LagReport is the consumer group's lag per partition.
type LagReport struct {
	Group      string         `json:"group"`
	Topics     []string       `json:"topics"`
	Partitions []PartitionLag `json:"partitions"`
	// Total is the sum of the known lags.
	Total int64 `json:"total"`
	// KafkaError says why end offsets are missing (nil lags).
	KafkaError string `json:"kafka_error,omitempty"`
}

// Lag measures, per partition of the consumer's topics, how far the
// applied position (the next offset stored in Postgres with the events)
// is behind the partition's last stable offset in Kafka. On a topic written
// by Kafka transactions (the relay) each commit marker takes an offset: a
// caught-up partition's end is a marker. When the Service has a KafkaReader,
// a partition at most markerCheckMax offsets behind is read to count its
// events only, so a caught-up partition shows 0.
func (s *Service) Lag(ctx context.Context) (LagReport, error) {
	rep := LagReport{Group: s.cfg.Group, Topics: s.cfg.Topics, Partitions: []PartitionLag{}}
	if s.cfg.Group == "" || len(s.cfg.Topics) == 0 {
		return rep, nil
	}
	type key struct {
		topic string
		p     int32
	}
	parts := map[key]*PartitionLag{}
	get := func(t string, p int32) *PartitionLag {
		k := key{t, p}
		if parts[k] == nil {
			parts[k] = &PartitionLag{Topic: t, Partition: p}
		}
		return parts[k]
	}
	rows, err := s.cfg.Pool.Query(ctx, qStoredOffsets, s.cfg.Group, s.cfg.Topics)
	if err != nil {
		return rep, fmt.Errorf("stored offsets: %w", err)
	}
	var topic string
	var p int32
	var next int64
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&topic, &p, &next, &at}, func() error {
		pl := get(topic, p)
		n, a := next, at
		pl.StoredNextOffset, pl.StoredAt = &n, &a
		return nil
	}); err != nil {
		return rep, fmt.Errorf("stored offsets: %w", err)
	}
	if s.cfg.Kafka != nil {
		if err := s.kafkaOffsets(ctx, get); err != nil {
			rep.KafkaError = err.Error()
		}
	} else {
		rep.KafkaError = "no Kafka admin client: end offsets unknown"
	}
	near := map[string]map[int32]offsetSpan{}
	for _, pl := range parts {
		if pl.EndOffset == nil {
			continue
		}
		pos := pl.StoredNextOffset
		if pos == nil {
			pos = pl.KafkaCommitted
		}
		if pos == nil {
			pos = pl.StartOffset
		}
		if pos == nil {
			continue
		}
		lag := max(*pl.EndOffset-*pos, 0)
		pl.Lag = &lag
		if lag > 0 && lag <= markerCheckMax {
			if near[pl.Topic] == nil {
				near[pl.Topic] = map[int32]offsetSpan{}
			}
			near[pl.Topic][pl.Partition] = offsetSpan{from: *pos, end: *pl.EndOffset}
		}
	}
	if len(near) > 0 && s.cfg.KafkaReader != nil {
		events, err := s.countEvents(ctx, near)
		if err != nil {
			s.cfg.Logger.WarnContext(ctx, "admin: lag: reading past commit markers", slog.String("error", err.Error()))
		}
		for k, n := range events {
			*parts[key(k)].Lag = n
		}
	}
	for _, pl := range parts {
		if pl.Lag != nil {
			rep.Total += *pl.Lag
		}
	}
	for _, pl := range parts {
		rep.Partitions = append(rep.Partitions, *pl)
	}
	slices.SortFunc(rep.Partitions, func(a, b PartitionLag) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	return rep, nil
}

func (s *Service) kafkaOffsets(ctx context.Context, get func(string, int32) *PartitionLag) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	adm := s.cfg.Kafka
	ends, err := adm.ListCommittedOffsets(ctx, s.cfg.Topics...)
	if err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	if err := ends.Error(); err != nil {
		return fmt.Errorf("list end offsets: %w", err)
	}
	ends.Each(func(o kadm.ListedOffset) {
		pl := get(o.Topic, o.Partition)
		v := o.Offset
		pl.EndOffset = &v
	})
	starts, err := adm.ListStartOffsets(ctx, s.cfg.Topics...)
	if err == nil {
		starts.Each(func(o kadm.ListedOffset) {
			if o.Err == nil {
				v := o.Offset
				get(o.Topic, o.Partition).StartOffset = &v
			}
		})
	}
	committed, err := adm.FetchOffsetsForTopics(ctx, s.cfg.Group, s.cfg.Topics...)
	if err != nil {
		return fmt.Errorf("fetch group offsets: %w", err)
	}
	committed.Each(func(o kadm.OffsetResponse) {
		if o.Err == nil && o.At >= 0 {
			v := o.At
			get(o.Topic, o.Partition).KafkaCommitted = &v
		}
	})
	return nil
}

// markerCheckMax is how far behind a partition may be for lag to read it
// and leave its commit markers out; further behind, the offset difference
// is close enough.
const markerCheckMax = 256

// offsetSpan is the offsets from the applied position to the end.
type offsetSpan struct{ from, end int64 }

type partKey struct {
	topic string
	p     int32
}

// countEvents reads each partition's span with read_committed, commit
// markers kept, and counts the records that are events (not markers). A
// partition whose span was not read to its end within the time allowed is
// left out of the answer (its offset difference stands).
func (s *Service) countEvents(ctx context.Context, spans map[string]map[int32]offsetSpan) (map[partKey]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := map[string]map[int32]kgo.Offset{}
	left := 0
	for t, ps := range spans {
		start[t] = map[int32]kgo.Offset{}
		for p, sp := range ps {
			start[t][p] = kgo.NewOffset().At(sp.from)
			left++
		}
	}
	cl, err := s.cfg.KafkaReader(kgo.ConsumePartitions(start), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(), kgo.FetchMaxWait(250*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("reader client: %w", err)
	}
	defer cl.Close()
	events := map[partKey]int64{}
	done := map[partKey]bool{}
	for left > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		fs.EachRecord(func(r *kgo.Record) {
			k := partKey{r.Topic, r.Partition}
			sp := spans[r.Topic][r.Partition]
			if done[k] || r.Offset < sp.from || r.Offset >= sp.end {
				return
			}
			if !r.Attrs.IsControl() {
				events[k]++
			}
			if r.Offset == sp.end-1 {
				done[k] = true
				left--
			}
		})
	}
	out := map[partKey]int64{}
	for k := range done {
		out[k] = events[k]
	}
	if left > 0 {
		return out, fmt.Errorf("%d partition(s) not read to their end in time", left)
	}
	return out, nil
}
