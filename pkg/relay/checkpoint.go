package relay

import (
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
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
