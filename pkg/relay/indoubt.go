package relay

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A batch is in doubt when Kafka acknowledged every record of its
// transaction but the commit (EndTxn) got no answer. The next producer's
// initialisation ends the transaction, and recovery then reads how it ended.
// The checkpoint record alone answered that for the whole batch, on the
// grounds that Kafka ends a transaction the same way in every partition.
// A soak run found a transaction that Kafka 4.1.1 committed in some data
// partitions and aborted in the checkpoint partition (a transaction
// coordinator killed while its commit was being written, another one taking
// over and aborting): the relay published those rows again, and they stood
// on the topic twice. The opposite split would lose them: the checkpoint
// committed, a data record aborted, the row marked published.
//
// So an in-doubt batch is settled record by record: each record's partition
// is read from the record on, and the first transaction marker of its
// producer after it says whether it committed. A committed row is marked
// published, an aborted one is published again, whatever the checkpoint
// says; a split is logged as an error and counted (errors_total with kind
// split_transaction). Only a batch this process published can be settled so:
// a relay that crashed with a batch in doubt leaves the next one its
// checkpoint alone, which does not know where the records went.

// inDoubtRecord is where one record of an in-doubt transaction landed.
type inDoubtRecord struct {
	id        int64 // outbox row (0: the checkpoint record)
	topic     string
	partition int32
	offset    int64
	pid       int64
}

// inDoubtBatch is a transaction whose commit outcome is unknown.
type inDoubtBatch struct {
	rows []inDoubtRecord
	ckpt inDoubtRecord
	at   time.Time // when the commit failed
}

// inDoubtPatience is how long recovery keeps failing on a batch it cannot
// settle by its records (a partition without a leader, a topic deleted
// since) before it settles the batch by its checkpoint alone, as before,
// and says so: a relay must not stop publishing for good over one batch.
const inDoubtPatience = 5 * time.Minute

// newInDoubt records where recs landed; rowOf names the data records' rows.
// It returns nil when a record has no offset (it was not acknowledged):
// then the batch cannot be settled by its records.
func newInDoubt(recs []*kgo.Record, rowOf map[*kgo.Record]int64) *inDoubtBatch {
	d := &inDoubtBatch{at: time.Now()}
	for _, r := range recs {
		if r.Offset < 0 || r.ProducerID < 0 {
			return nil
		}
		at := inDoubtRecord{topic: r.Topic, partition: r.Partition, offset: r.Offset, pid: r.ProducerID}
		if id, ok := rowOf[r]; ok {
			at.id = id
			d.rows = append(d.rows, at)
		} else {
			d.ckpt = at
		}
	}
	if d.ckpt.topic == "" {
		return nil
	}
	return d
}

// settlement is how an in-doubt batch ended, record by record.
type settlement struct {
	committed, aborted []int64 // outbox rows
	ckptCommitted      bool
}

// split reports whether Kafka ended the transaction differently in
// different partitions.
func (s settlement) split() bool {
	if len(s.committed) > 0 && len(s.aborted) > 0 {
		return true
	}
	return (s.ckptCommitted && len(s.aborted) > 0) || (!s.ckptCommitted && len(s.committed) > 0)
}

func (s settlement) String() string {
	ck := "aborted"
	if s.ckptCommitted {
		ck = "committed"
	}
	return fmt.Sprintf("%d rows committed, %d aborted, checkpoint %s", len(s.committed), len(s.aborted), ck)
}

// pidMarker is a transaction marker of one producer in one partition.
type pidMarker struct {
	pid    int64
	offset int64
	commit bool
}

// decide settles d from the markers read in each record's partition
// (markers[topic][partition], sorted by offset). A record whose producer
// has no marker after it is undecided: an error.
func decide(d *inDoubtBatch, markers map[string]map[int32][]pidMarker) (settlement, error) {
	outcome := func(r inDoubtRecord) (bool, error) {
		for _, m := range markers[r.topic][r.partition] {
			if m.pid == r.pid && m.offset > r.offset {
				return m.commit, nil
			}
		}
		return false, fmt.Errorf("record %s[%d]@%d (producer id %d): its transaction is not decided in its partition yet", r.topic, r.partition, r.offset, r.pid)
	}
	var s settlement
	var err error
	if s.ckptCommitted, err = outcome(d.ckpt); err != nil {
		return settlement{}, err
	}
	for _, r := range d.rows {
		commit, err := outcome(r)
		if err != nil {
			return settlement{}, err
		}
		if commit {
			s.committed = append(s.committed, r.id)
		} else {
			s.aborted = append(s.aborted, r.id)
		}
	}
	return s, nil
}

// settleInDoubt reads the markers that end d's transaction in each of its
// partitions (read_uncommitted, from the batch's first record there to the
// high watermark) and settles it. Call it after the next producer has
// initialised the transactional.id, which ends the transaction.
func settleInDoubt(ctx context.Context, opts []kgo.Opt, d *inDoubtBatch) (settlement, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return settlement{}, fmt.Errorf("in-doubt reader: %w", err)
	}
	defer cl.Close()
	type tp struct {
		topic     string
		partition int32
	}
	from := map[tp]int64{}
	for _, r := range append([]inDoubtRecord{d.ckpt}, d.rows...) {
		k := tp{r.topic, r.partition}
		if lo, ok := from[k]; !ok || r.offset < lo {
			from[k] = r.offset
		}
	}
	var topics []string
	for k := range from {
		if !slices.Contains(topics, k.topic) {
			topics = append(topics, k.topic)
		}
	}
	slices.Sort(topics)
	adm := kadm.NewClient(cl)
	md, err := adm.Metadata(ctx, topics...)
	if err != nil {
		return settlement{}, fmt.Errorf("metadata of %s: %w", strings.Join(topics, ", "), err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return settlement{}, fmt.Errorf("list end offsets of %s: %w", strings.Join(topics, ", "), err)
	}
	markers := map[string]map[int32][]pidMarker{}
	keys := make([]tp, 0, len(from))
	for k := range from {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b tp) int { return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition)) })
	for _, k := range keys {
		td, ok := md.Topics[k.topic]
		if !ok || td.Err != nil {
			return settlement{}, fmt.Errorf("metadata of %q: %v", k.topic, td.Err)
		}
		pd, ok := td.Partitions[k.partition]
		if !ok {
			return settlement{}, fmt.Errorf("metadata of %q: no partition %d", k.topic, k.partition)
		}
		end, ok := ends.Lookup(k.topic, k.partition)
		if !ok {
			return settlement{}, fmt.Errorf("%s[%d]: end offset not listed", k.topic, k.partition)
		}
		pr := partitionReader{cl: cl, topic: k.topic, topicID: td.ID, partition: k.partition, leader: pd.Leader}
		var ms []pidMarker
		err := pr.read(ctx, from[k], end.Offset, func(r *kgo.Record) {
			// The key of a control record: int16 version, int16 type
			// (0 abort, 1 commit).
			if r.Attrs.IsControl() && len(r.Key) >= 4 {
				ms = append(ms, pidMarker{pid: r.ProducerID, offset: r.Offset, commit: r.Key[3] == 1})
			}
		})
		if err != nil {
			return settlement{}, err
		}
		if markers[k.topic] == nil {
			markers[k.topic] = map[int32][]pidMarker{}
		}
		markers[k.topic][k.partition] = ms
	}
	return decide(d, markers)
}
