package admin

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
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
	// Lag is EndOffset minus the stored next offset (or, before the
	// first batch, the Kafka committed offset, or else the start offset).
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
// by Kafka transactions (the relay) each commit marker takes an offset, so a
// caught-up partition can show a lag of 1.
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
		rep.Total += lag
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
