ALTER TABLE onceflow.outbox DROP CONSTRAINT IF EXISTS outbox_event_id_not_reserved;
ALTER TABLE onceflow.seq_state DROP COLUMN IF EXISTS first_seq;
DROP INDEX IF EXISTS onceflow.effects_event_id;
-- One row per key again: the row of the lowest scope wins.
DELETE FROM onceflow.effects e
 WHERE EXISTS (SELECT 1 FROM onceflow.effects o
                WHERE o.idempotency_key = e.idempotency_key AND o.scope < e.scope);
ALTER TABLE onceflow.effects DROP CONSTRAINT IF EXISTS effects_scope_length;
ALTER TABLE onceflow.effects DROP CONSTRAINT effects_pkey;
ALTER TABLE onceflow.effects ADD PRIMARY KEY (idempotency_key);
ALTER TABLE onceflow.effects DROP COLUMN scope;
CREATE INDEX effects_event_id ON onceflow.effects (event_id);
ALTER TABLE onceflow.consumer_offsets DROP COLUMN IF EXISTS topic_id;
