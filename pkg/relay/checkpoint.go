package relay

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A checkpoint record names the outbox rows of a Kafka transaction (and of
// the previous one, whose mark may still be running). Its key is
// "<database identity>/<shard>" and its value, version 2:
//
//	v2 db=<database identity> ids=12-40,44,51-90 fp=<base64url>
//
// ids are the outbox ids as sorted ranges; fp holds, for each id in that
// order, 4 bytes: the FNV-1a hash of the row's event id. Recovery marks a row
// only if its event id still matches, so a checkpoint can never mark a
// different row that happens to have the same id (a restored or copied
// database). Version 1 ("v1 12-40,44") was written, under the bare shard
// name, before databases had identities; it is read only to settle a legacy
// checkpoint (see settleLegacy).
//
// Version 2 later gained an optional field, hi (written since restore
// detection by stream; relays that predate it skip it, as they skip every
// field they do not know):
//
//	hi=<topic>:<source>:<seq>:<id>,…
//
// one entry per (topic, source) among the rows, topic and source in
// base64url: the highest seq the checkpoint's rows hold for that stream and
// the id of its row (one of ids, whose fingerprint is in fp). Recovery
// checks each entry against the database (checkStreams): a database
// restored to before that row either lacks the row and has a counter below
// the seq, or holds another event at that seq. A record without hi is read
// as before.
const (
	checkpointV1 = "v1 "
	checkpointV2 = "v2 "
)

// checkpoint is a decoded checkpoint record.
type checkpoint struct {
	db  string       // database identity (empty for v1)
	ids []int64      // sorted, distinct
	fps []uint32     // per id (nil for v1)
	hi  []streamHigh // per stream (nil for v1 and for v2 records without hi)
}

// streamKey is a stream: what one producer writes for one topic and
// source.
type streamKey struct{ topic, source string }

// streamHigh is the highest seq, and its row, that a checkpoint's rows hold
// for one stream.
type streamHigh struct {
	streamKey
	seq int64
	id  int64
	fp  uint32 // fingerprint of the row's event id (from fp when decoded)
}

// ckptSet is what a checkpoint names: ids with their event fingerprints and,
// per stream, the highest seq.
type ckptSet struct {
	fps map[int64]uint32
	hi  map[streamKey]streamHigh
}

func newCkptSet(n int) ckptSet {
	return ckptSet{fps: make(map[int64]uint32, n), hi: map[streamKey]streamHigh{}}
}

// add names row w.
func (c ckptSet) add(w row) {
	c.fps[w.id] = w.fp
	k := streamKey{w.topic, w.source}
	if h, ok := c.hi[k]; !ok || w.seq > h.seq {
		c.hi[k] = streamHigh{streamKey: k, seq: w.seq, id: w.id, fp: w.fp}
	}
}

// merge names everything o names too.
func (c ckptSet) merge(o ckptSet) {
	maps.Copy(c.fps, o.fps)
	for k, h := range o.hi {
		if cur, ok := c.hi[k]; !ok || h.seq > cur.seq {
			c.hi[k] = h
		}
	}
}

// highs returns the entries sorted by stream.
func (c ckptSet) highs() []streamHigh {
	hs := slices.Collect(maps.Values(c.hi))
	slices.SortFunc(hs, func(a, b streamHigh) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.source, b.source))
	})
	return hs
}

// fingerprint is what a checkpoint records of an outbox row's event id.
func fingerprint(eventID string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(eventID))
	return h.Sum32()
}

// checkpointKey is the record key of a database's shard.
func checkpointKey(identity, shard string) string { return identity + "/" + shard }

// encodeCheckpointSet encodes what set names for database db, hi included.
func encodeCheckpointSet(db string, set ckptSet) []byte {
	b := encodeCheckpoint(db, set.fps)
	hs := set.highs()
	if len(hs) == 0 {
		return b
	}
	b = append(b, " hi="...)
	for i, h := range hs {
		if i > 0 {
			b = append(b, ',')
		}
		b = base64.RawURLEncoding.AppendEncode(b, []byte(h.topic))
		b = append(b, ':')
		b = base64.RawURLEncoding.AppendEncode(b, []byte(h.source))
		b = append(b, ':')
		b = strconv.AppendInt(b, h.seq, 10)
		b = append(b, ':')
		b = strconv.AppendInt(b, h.id, 10)
	}
	return b
}

// encodeCheckpoint encodes rows (id -> event id fingerprint) for database
// db, without hi (a record as relays before hi wrote it).
func encodeCheckpoint(db string, rows map[int64]uint32) []byte {
	ids := make([]int64, 0, len(rows))
	for id := range rows {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b := []byte(checkpointV2 + "db=" + db + " ids=")
	b = appendRanges(b, ids)
	fp := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.BigEndian.PutUint32(fp[4*i:], rows[id])
	}
	b = append(b, " fp="...)
	return base64.RawURLEncoding.AppendEncode(b, fp)
}

// encodeIDs is the version 1 value (tests and the legacy format only).
func encodeIDs(ids []int64) []byte {
	s := slices.Compact(slices.Sorted(slices.Values(ids)))
	return appendRanges([]byte(checkpointV1), s)
}

func appendRanges(b []byte, s []int64) []byte {
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
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

// decodeCheckpoint decodes a version 1 or 2 value.
func decodeCheckpoint(v []byte) (checkpoint, error) {
	s := string(v)
	if rest, ok := strings.CutPrefix(s, checkpointV1); ok {
		ids, err := decodeRanges(rest)
		return checkpoint{ids: ids}, err
	}
	rest, ok := strings.CutPrefix(s, checkpointV2)
	if !ok {
		return checkpoint{}, fmt.Errorf("checkpoint %q: unknown version", truncate(s, 40))
	}
	var c checkpoint
	var ranges, fp, hi string
	seen := map[string]bool{}
	for _, field := range strings.Fields(rest) {
		k, val, _ := strings.Cut(field, "=")
		if seen[k] {
			return checkpoint{}, fmt.Errorf("checkpoint: field %q twice", k)
		}
		seen[k] = true
		switch k {
		case "db":
			c.db = val
		case "ids":
			ranges = val
		case "fp":
			fp = val
		case "hi":
			hi = val
		default: // later versions may add fields
		}
	}
	if c.db == "" || !seen["ids"] || !seen["fp"] {
		return checkpoint{}, fmt.Errorf("checkpoint %q: db, ids or fp missing", truncate(s, 60))
	}
	var err error
	if c.ids, err = decodeRanges(ranges); err != nil {
		return checkpoint{}, err
	}
	raw, err := base64.RawURLEncoding.DecodeString(fp)
	if err != nil || len(raw) != 4*len(c.ids) {
		return checkpoint{}, fmt.Errorf("checkpoint: fp holds %d bytes for %d ids", len(raw), len(c.ids))
	}
	c.fps = make([]uint32, len(c.ids))
	for i := range c.fps {
		c.fps[i] = binary.BigEndian.Uint32(raw[4*i:])
	}
	if seen["hi"] {
		if c.hi, err = decodeHighs(hi, c); err != nil {
			return checkpoint{}, err
		}
	}
	return c, nil
}

// decodeHighs parses the hi field of c; every entry's id must be one of
// c's ids (its fingerprint is taken from fp).
func decodeHighs(s string, c checkpoint) ([]streamHigh, error) {
	if s == "" {
		return nil, errors.New("checkpoint: hi is empty")
	}
	parts := strings.Split(s, ",")
	if len(parts) > len(c.ids) {
		return nil, fmt.Errorf("checkpoint: hi names %d streams for %d ids", len(parts), len(c.ids))
	}
	hs := make([]streamHigh, 0, len(parts))
	for _, part := range parts {
		f := strings.Split(part, ":")
		if len(f) != 4 {
			return nil, fmt.Errorf("checkpoint hi entry %q: want topic:source:seq:id", truncate(part, 40))
		}
		topic, err1 := base64.RawURLEncoding.DecodeString(f[0])
		source, err2 := base64.RawURLEncoding.DecodeString(f[1])
		seq, err3 := strconv.ParseInt(f[2], 10, 64)
		id, err4 := strconv.ParseInt(f[3], 10, 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil || seq <= 0 {
			return nil, fmt.Errorf("checkpoint hi entry %q is invalid: %v", truncate(part, 40), err)
		}
		i, ok := slices.BinarySearch(c.ids, id)
		if !ok {
			return nil, fmt.Errorf("checkpoint hi entry %q names id %d, which ids does not", truncate(part, 40), id)
		}
		hs = append(hs, streamHigh{streamKey: streamKey{string(topic), string(source)}, seq: seq, id: id, fp: c.fps[i]})
	}
	return hs, nil
}

// decodeRanges parses "12-40,44" into sorted, distinct ids.
func decodeRanges(s string) ([]int64, error) {
	ids := []int64{}
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
		if len(ids) > 0 && a <= ids[len(ids)-1] {
			return nil, fmt.Errorf("checkpoint range %q is not above the one before", part)
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
		return fmt.Errorf("checkpoint topic %q partition %d has no leader", p.topic, p.partition)
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
			return fmt.Errorf("read checkpoint %s[%d] at offset %d: %w", p.topic, p.partition, off, err)
		}
		if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
			return fmt.Errorf("read checkpoint %s[%d] at offset %d: %w", p.topic, p.partition, off, err)
		}
		if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
			return fmt.Errorf("read checkpoint %s[%d] at offset %d: unexpected fetch response shape", p.topic, p.partition, off)
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
			return fmt.Errorf("read checkpoint %s[%d] at offset %d: %w", p.topic, p.partition, off, part.Err)
		}
		for _, r := range part.Records {
			if r.Offset >= lo && r.Offset < hi {
				visit(r)
			}
		}
		if next <= off {
			return fmt.Errorf("read checkpoint %s[%d]: no progress at offset %d (high watermark %d, reading up to %d)",
				p.topic, p.partition, off, part.HighWatermark, hi)
		}
		off = next
	}
	return nil
}
