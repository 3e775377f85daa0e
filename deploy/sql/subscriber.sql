-- A producing database fed by logical replication (docs/relay.md, "A producing
-- database fed by logical replication"): run on the subscriber, as the owner
-- of the onceflow schema, after `relay migrate` and before the subscription
-- applies its first row.
--
-- Logical replication's apply worker writes with session_replication_role =
-- replica and fires row triggers only, so the outbox's own queue trigger
-- (statement-level, enabled for origin sessions) never queues what it writes.
-- This row-level trigger, enabled for replica sessions only, queues each
-- applied row in the apply worker's transaction, in the source's commit
-- order; rows written by local sessions are queued by the outbox's own
-- trigger as before, never twice.
CREATE SCHEMA onceflow_subscriber;

CREATE FUNCTION onceflow_subscriber.queue_replicated_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    INSERT INTO onceflow.outbox_pending (id) VALUES (NEW.id);
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow_subscriber.queue_replicated_row() FROM PUBLIC;

CREATE TRIGGER outbox_pending_replicated AFTER INSERT ON onceflow.outbox
    FOR EACH ROW EXECUTE FUNCTION onceflow_subscriber.queue_replicated_row();
ALTER TABLE onceflow.outbox ENABLE REPLICA TRIGGER outbox_pending_replicated;
