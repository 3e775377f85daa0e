ALTER TABLE onceflow.relay_lease DROP COLUMN IF EXISTS shards;
DROP FUNCTION IF EXISTS onceflow.source_shard(text, integer);
