-- The relay's work queue and publish log (docs/relay.md, "How the relay
-- records what it published").
--
-- Until this migration the relay recorded a published row by setting
-- onceflow.outbox.published_at. That UPDATE could not be HOT (the column
-- named two partial indexes), so every published event wrote a new version
-- of its whole row and an entry into each of the outbox's indexes: most of
-- the relay's database time. Now the outbox rows are written once and never
-- updated:
--
--   onceflow.outbox_pending    the ids of the rows not yet published, one
--                              narrow row each, inserted in the producer's
--                              own statement by a trigger (so no insert
--                              path, including a hand-written INSERT or
--                              COPY, can leave a row out) and deleted by the
--                              relay when the row's Kafka transaction has
--                              committed;
--   onceflow.outbox_published  one row per published batch: when, and which
--                              ids. The relay's retention deletes a batch's
--                              outbox rows and its log row together.
--
-- A row is published exactly when its id is not in onceflow.outbox_pending;
-- onceflow.outbox_published_at(id) tells when.

CREATE TABLE onceflow.outbox_pending (
    id bigint PRIMARY KEY
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
        autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000);

CREATE TABLE onceflow.outbox_published (
    batch        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    published_at timestamptz NOT NULL DEFAULT now(),
    first_id     bigint      NOT NULL,
    last_id      bigint      NOT NULL,
    ids          bigint[]    NOT NULL,
    CONSTRAINT outbox_published_ids_not_empty CHECK (cardinality(ids) > 0)
);
CREATE INDEX outbox_published_published_at ON onceflow.outbox_published (published_at);

-- The triggers keep onceflow.outbox_pending a subset of the outbox's ids:
-- every inserted row is pending until the relay publishes it, and a deleted
-- (or truncated) row is pending no more. They run with their owner's rights
-- (SECURITY DEFINER), so producers need no grant on the queue. One trigger
-- call per statement, whatever the number of rows.
CREATE FUNCTION onceflow.outbox_pending_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    INSERT INTO onceflow.outbox_pending (id) SELECT n.id FROM outbox_new n;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_pending_insert() FROM PUBLIC;

CREATE FUNCTION onceflow.outbox_pending_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    DELETE FROM onceflow.outbox_pending p USING outbox_old o WHERE p.id = o.id;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_pending_delete() FROM PUBLIC;

CREATE FUNCTION onceflow.outbox_pending_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    TRUNCATE onceflow.outbox_pending;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_pending_truncate() FROM PUBLIC;

-- When a published row was published (NULL: pending, or its batch was
-- pruned). For inspection; not fast on a large log.
CREATE FUNCTION onceflow.outbox_published_at(outbox_id bigint) RETURNS timestamptz
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT l.published_at FROM onceflow.outbox_published l
     WHERE l.first_id <= outbox_id AND l.last_id >= outbox_id AND outbox_id = ANY (l.ids)
     LIMIT 1
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_published_at(bigint) FROM PUBLIC;

-- Carry the rows over: the unpublished ones into the queue, the published
-- ones into the log, one log row per mark (a mark set one published_at).
LOCK TABLE onceflow.outbox IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO onceflow.outbox_pending (id)
SELECT id FROM onceflow.outbox WHERE published_at IS NULL ORDER BY id;
INSERT INTO onceflow.outbox_published (published_at, first_id, last_id, ids)
SELECT published_at, min(id), max(id), array_agg(id ORDER BY id)
  FROM onceflow.outbox WHERE published_at IS NOT NULL
 GROUP BY published_at ORDER BY published_at;

CREATE TRIGGER outbox_pending_insert AFTER INSERT ON onceflow.outbox
    REFERENCING NEW TABLE AS outbox_new
    FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_pending_insert();
CREATE TRIGGER outbox_pending_delete AFTER DELETE ON onceflow.outbox
    REFERENCING OLD TABLE AS outbox_old
    FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_pending_delete();
CREATE TRIGGER outbox_pending_truncate AFTER TRUNCATE ON onceflow.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_pending_truncate();

-- The column goes, so that a query or a relay still reading it fails
-- loudly instead of finding every new row "unpublished".
DROP INDEX onceflow.outbox_unpublished;
DROP INDEX onceflow.outbox_published_at;
ALTER TABLE onceflow.outbox DROP COLUMN published_at;

-- The console's relay status counts the queue.
CREATE OR REPLACE FUNCTION onceflow.relay_status()
RETURNS TABLE (pending_rows bigint, oldest_unpublished_at timestamptz, db_now timestamptz, leases jsonb)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT (SELECT count(*) FROM onceflow.outbox_pending),
           (SELECT min(o.created_at) FROM onceflow.outbox_pending p JOIN onceflow.outbox o ON o.id = p.id),
           now(),
           coalesce((SELECT jsonb_agg(jsonb_build_object(
                        'shard', l.shard, 'shards', l.shards, 'holder', l.holder, 'epoch', l.epoch,
                        'acquired_at', l.acquired_at, 'renewed_at', l.renewed_at,
                        'expires_at', l.expires_at, 'live', l.expires_at > now())
                        ORDER BY l.shard)
                     FROM onceflow.relay_lease l), '[]'::jsonb)
$fn$;
