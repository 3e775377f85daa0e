package relay

import (
	"crypto/md5"
	"encoding/binary"
	"strconv"
)

// SourceShard is the shard that publishes source when Shards relays split
// a database's sources: the first four bytes of the MD5 of the source's
// UTF-8 bytes, read as a big-endian unsigned 32-bit integer, modulo shards
// (0 when shards <= 1). It never changes for a given source and count, so a
// source belongs to exactly one shard and its events keep their order. The
// SQL function onceflow.source_shard(source, shards) is the same function;
// the relay filters its reads with it. MD5 serves as a well-spread hash
// that PostgreSQL and Go both have built in, not for security.
func SourceShard(source string, shards int) int {
	if shards <= 1 {
		return 0
	}
	sum := md5.Sum([]byte(source))
	return int(binary.BigEndian.Uint32(sum[:4]) % uint32(shards))
}

// isShardIndex reports whether s is a shard index of shards in canonical
// decimal ("1", not "01" or "+1": one shard, one lease row).
func isShardIndex(s string, shards int) bool {
	k, err := strconv.Atoi(s)
	return err == nil && k >= 0 && k < shards && strconv.Itoa(k) == s
}

// DefaultTransactionalID is the transactional.id a relay of shard uses when
// no TransactionalIDPrefix is configured.
func DefaultTransactionalID(identity, shard string) string {
	return "onceflow-relay-" + identity + "-" + shard
}

// CheckpointKey is the key of shard's checkpoint records for identity.
func CheckpointKey(identity, shard string) string { return checkpointKey(identity, shard) }

// layout is this relay's place among its database's shards.
type layout struct {
	shards int
	index  int // Shard's index when shards > 1
}

// sharded returns the statement for this relay's rows: whole when Shards is
// 1, else shard with the shard count and this shard's index appended to
// args.
func (l layout) sharded(whole, shard string, args ...any) (string, []any) {
	if l.shards <= 1 {
		return whole, args
	}
	return shard, append(args, l.shards, l.index)
}

// own is the filter of the sources this shard publishes; nil with one
// shard (every source).
func (l layout) own() func(source string) bool {
	if l.shards <= 1 {
		return nil
	}
	return func(source string) bool { return SourceShard(source, l.shards) == l.index }
}
