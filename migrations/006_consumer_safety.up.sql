-- Durable cursors bound to what they point into (docs/consumer.md,
-- docs/effects.md, docs/seqguard.md).

-- A stored next offset names the Kafka topic ID of the log it was read from.
-- A row whose topic_id is not the topic's current ID (the topic was deleted
-- and recreated) or is NULL (written before this column existed) is never
-- used for a seek; the next batch of the current topic replaces it.
ALTER TABLE onceflow.consumer_offsets ADD COLUMN topic_id text;

-- Effects ledger rows belong to a scope: '' for direct callers that pass
-- none, and for the consumer's http handler "inbox/<consumer>/http/<event
-- type entry>" (each part path-escaped). The same idempotency key in two
-- scopes is two effects. Rows written before this migration keep scope ''.
ALTER TABLE onceflow.effects ADD COLUMN scope text NOT NULL DEFAULT '';
ALTER TABLE onceflow.effects DROP CONSTRAINT effects_pkey;
ALTER TABLE onceflow.effects ADD PRIMARY KEY (scope, idempotency_key);
ALTER TABLE onceflow.effects ADD CONSTRAINT effects_scope_length CHECK (octet_length(scope) <= 512);
DROP INDEX onceflow.effects_event_id;
CREATE INDEX effects_event_id ON onceflow.effects (event_id, scope);

-- The seq a source started at: 1 under expect-first-seq-1, the first seq
-- seen under accept-first-seen. Seqs below it were never applied. NULL for
-- sources started before this column existed (docs/seqguard.md says how
-- they are read).
ALTER TABLE onceflow.seq_state ADD COLUMN first_seq bigint;

-- Inbox keys of records that break the envelope start with "malformed:";
-- an event id may not, so the two can never collide. NOT VALID: rows
-- already in the outbox are not checked, new ones are.
ALTER TABLE onceflow.outbox ADD CONSTRAINT outbox_event_id_not_reserved
    CHECK (left(event_id, 10) <> 'malformed:') NOT VALID;
