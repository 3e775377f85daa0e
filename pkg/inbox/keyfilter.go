package inbox

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// keyFilter is a Bloom filter of a sealed bucket's event ids: mayHave is
// true for every id added, and for about one other id in a hundred. It is
// blocked (each id sets and tests eight bits of one 64-byte block, one
// bit per 64-bit word), so a look-up touches one cache line: a batch of
// 500 ids against nine buckets' filters costs some 4,500 memory reads,
// well under a millisecond, where each skipped bucket saves PostgreSQL an
// index descent per id.
//
// The hash (keyHash) and the layout are stored with the filter in the
// database (onceflow.inbox_filters.filter) and read by every replica, so
// they must never change meaning: a new layout needs a new version byte.
type keyFilter struct {
	blocks [][8]uint64
}

// keyFilterBitsPerKey is the filter's size per id: about 1 % of the ids
// not in a bucket are probed in it anyway.
const keyFilterBitsPerKey = 10

// keyFilter's stored form: magic, version, block count, then the blocks'
// words, little-endian.
const (
	keyFilterMagic   = "OFKF"
	keyFilterVersion = 1
	keyFilterHeader  = len(keyFilterMagic) + 1 + 8
)

// keyFilterSalts pick the bit of each word from the hash's low 32 bits
// (odd constants, as in Parquet's split-block Bloom filter).
var keyFilterSalts = [8]uint32{0x47b6137b, 0x44974d91, 0x8824ad5b, 0xa2b7289d, 0x705495c7, 0x2df1424b, 0x9efc4947, 0x5c6bfb31}

// newKeyFilter returns an empty filter sized for n ids.
func newKeyFilter(n int) *keyFilter {
	if n <= 0 {
		return &keyFilter{}
	}
	nb := (n*keyFilterBitsPerKey + 511) / 512
	return &keyFilter{blocks: make([][8]uint64, nb)}
}

// keyHash is the 64-bit hash of an event id the filters use: FNV-1a, then
// a finalizer that spreads every input bit over the output (ids that
// differ in one character, order-41 and order-42, land far apart).
func keyHash(id string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// block returns the block of hash h and the eight bits (one per word) it
// sets or tests there.
func (f *keyFilter) block(h uint64) (*[8]uint64, [8]uint64) {
	i := (h >> 32) * uint64(len(f.blocks)) >> 32 // in [0, blocks), no division
	var mask [8]uint64
	lo := uint32(h)
	for j, s := range keyFilterSalts {
		mask[j] = 1 << ((lo * s) >> 26)
	}
	return &f.blocks[i], mask
}

// add records an id by its hash (keyHash).
func (f *keyFilter) add(h uint64) {
	b, mask := f.block(h)
	for i := range b {
		b[i] |= mask[i]
	}
}

// mayHave reports whether an id of hash h may have been added: false only
// when it certainly was not.
func (f *keyFilter) mayHave(h uint64) bool {
	if len(f.blocks) == 0 {
		return false
	}
	b, mask := f.block(h)
	for i := range b {
		if b[i]&mask[i] == 0 {
			return false
		}
	}
	return true
}

// marshal returns the filter's stored form.
func (f *keyFilter) marshal() []byte {
	out := make([]byte, keyFilterHeader, keyFilterHeader+len(f.blocks)*64)
	copy(out, keyFilterMagic)
	out[len(keyFilterMagic)] = keyFilterVersion
	binary.LittleEndian.PutUint64(out[len(keyFilterMagic)+1:], uint64(len(f.blocks)))
	for _, b := range f.blocks {
		for _, w := range b {
			out = binary.LittleEndian.AppendUint64(out, w)
		}
	}
	return out
}

// unmarshalKeyFilter reads a stored filter.
func unmarshalKeyFilter(data []byte) (*keyFilter, error) {
	if len(data) < keyFilterHeader || string(data[:len(keyFilterMagic)]) != keyFilterMagic {
		return nil, errors.New("inbox key filter: not a filter (bad magic)")
	}
	if v := data[len(keyFilterMagic)]; v != keyFilterVersion {
		return nil, fmt.Errorf("inbox key filter: version %d, this consumer reads version %d", v, keyFilterVersion)
	}
	nb := binary.LittleEndian.Uint64(data[len(keyFilterMagic)+1:])
	body := data[keyFilterHeader:]
	if uint64(len(body)) != nb*64 {
		return nil, fmt.Errorf("inbox key filter: %d bytes for %d blocks, want %d", len(body), nb, nb*64)
	}
	f := &keyFilter{blocks: make([][8]uint64, nb)}
	for i := range f.blocks {
		for j := range f.blocks[i] {
			f.blocks[i][j] = binary.LittleEndian.Uint64(body[(i*8+j)*8:])
		}
	}
	return f, nil
}
