-- Relay shards (docs/relay.md, "Shards"): N relay leaders split one
-- database's sources, each publishing the sources whose shard is its own.

-- The shard of a source among shards: the first four bytes of the MD5 of
-- the source's UTF-8 bytes, read as a big-endian unsigned 32-bit integer,
-- modulo shards. pkg/outbox's SourceShard is the same function in Go (a test
-- holds them equal). One SQL expression, so the planner inlines it.
CREATE FUNCTION onceflow.source_shard(source text, shards integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT (('x' || left(md5(source), 8))::bit(32)::bigint % shards)::integer
$fn$;

-- The shard count of the relay holding each lease. Relays with another
-- count would give a source to two shards at once (or to none), so a relay
-- takes no lease while a relay with another count holds one, and settles
-- the checkpoints of another count's expired leases before it publishes.
ALTER TABLE onceflow.relay_lease ADD COLUMN shards integer NOT NULL DEFAULT 1 CHECK (shards >= 1);
