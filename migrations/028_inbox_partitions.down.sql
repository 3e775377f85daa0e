-- Back to one unpartitioned onceflow.inbox: the rows of the buckets, the
-- permanent partitions and the default partition move into the legacy
-- partition (ACCESS EXCLUSIVE on onceflow.inbox for the whole transaction:
-- consumers wait), which becomes onceflow.inbox again.
LOCK TABLE onceflow.inbox IN ACCESS EXCLUSIVE MODE;
INSERT INTO onceflow.inbox_legacy (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset,
    status, late, attempts, last_error, headers, payload, received_at, processed_at, producer, lane, event_at)
SELECT consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset,
    status, late, attempts, last_error, headers, payload, received_at, processed_at, producer, 'legacy', '-infinity'
FROM onceflow.inbox WHERE lane <> 'legacy';
ALTER TABLE onceflow.inbox DETACH PARTITION onceflow.inbox_legacy;
DROP TABLE onceflow.inbox;
ALTER TABLE onceflow.inbox_legacy RENAME TO inbox;
ALTER TABLE onceflow.inbox RENAME CONSTRAINT inbox_legacy_pkey TO inbox_pkey;
ALTER INDEX onceflow.inbox_legacy_attention RENAME TO inbox_attention;
ALTER INDEX onceflow.inbox_legacy_received_at RENAME TO inbox_received_at;
ALTER INDEX onceflow.inbox_legacy_parked RENAME TO inbox_parked;
ALTER TABLE onceflow.inbox DROP CONSTRAINT inbox_legacy_key;
DROP INDEX onceflow.inbox_legacy_kept;
ALTER TABLE onceflow.inbox DROP CONSTRAINT inbox_legacy_lane;
ALTER TABLE onceflow.inbox DROP COLUMN lane, DROP COLUMN event_at;
DROP FUNCTION onceflow.inbox_drop_bucket(text, text, timestamptz);
DROP FUNCTION onceflow.inbox_expire_bucket(text, text, timestamptz);
DROP FUNCTION onceflow.inbox_lane(text, text);
DROP FUNCTION onceflow.inbox_ensure_buckets(text, text, timestamptz);
DROP FUNCTION onceflow.inbox_lane_width(text);
DROP TABLE onceflow.inbox_buckets;
DROP TABLE onceflow.inbox_classes;
DROP TABLE onceflow.inbox_lanes;
