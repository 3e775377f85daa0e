-- Back to published_at: rows in the log take their batch's time, rows that
-- are neither pending nor logged (their batch was pruned) take now().
LOCK TABLE onceflow.outbox IN SHARE ROW EXCLUSIVE MODE;
ALTER TABLE onceflow.outbox ADD COLUMN published_at timestamptz;
UPDATE onceflow.outbox o SET published_at = l.published_at
  FROM (SELECT unnest(ids) AS id, published_at FROM onceflow.outbox_published) l
 WHERE l.id = o.id;
UPDATE onceflow.outbox o SET published_at = now()
 WHERE o.published_at IS NULL AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_pending p WHERE p.id = o.id);
CREATE INDEX outbox_unpublished ON onceflow.outbox (id) WHERE published_at IS NULL;
CREATE INDEX outbox_published_at ON onceflow.outbox (published_at) WHERE published_at IS NOT NULL;

DROP TRIGGER outbox_pending_insert ON onceflow.outbox;
DROP TRIGGER outbox_pending_delete ON onceflow.outbox;
DROP TRIGGER outbox_pending_truncate ON onceflow.outbox;
DROP FUNCTION onceflow.outbox_pending_insert();
DROP FUNCTION onceflow.outbox_pending_delete();
DROP FUNCTION onceflow.outbox_pending_truncate();
DROP FUNCTION onceflow.outbox_published_at(bigint);
DROP TABLE onceflow.outbox_published;
DROP TABLE onceflow.outbox_pending;

CREATE OR REPLACE FUNCTION onceflow.relay_status()
RETURNS TABLE (pending_rows bigint, oldest_unpublished_at timestamptz, db_now timestamptz, leases jsonb)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT (SELECT count(*) FROM onceflow.outbox WHERE published_at IS NULL),
           (SELECT min(created_at) FROM onceflow.outbox WHERE published_at IS NULL),
           now(),
           coalesce((SELECT jsonb_agg(jsonb_build_object(
                        'shard', l.shard, 'holder', l.holder, 'epoch', l.epoch,
                        'acquired_at', l.acquired_at, 'renewed_at', l.renewed_at,
                        'expires_at', l.expires_at, 'live', l.expires_at > now())
                        ORDER BY l.shard)
                     FROM onceflow.relay_lease l), '[]'::jsonb)
$fn$;
