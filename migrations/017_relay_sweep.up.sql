-- The relay's sweep for unqueued outbox rows (docs/relay.md, "Rows written
-- while triggers do not fire").
--
-- A row inserted while the outbox's triggers do not fire (a session with
-- session_replication_role = replica: logical replication's apply worker,
-- pg_restore --disable-triggers, pgloader; or after ALTER TABLE … DISABLE
-- TRIGGER ALL) never enters onceflow.outbox_pending. The leader's sweep finds
-- such rows: an outbox row neither queued nor in the publish log. To tell
-- "in the log" cheaply for a range of ids, it looks up the log batches whose
-- id span overlaps the range through this index.
CREATE INDEX outbox_published_id_span ON onceflow.outbox_published
    USING gist (int8range(first_id, last_id, '[]'));
