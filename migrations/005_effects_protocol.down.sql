DROP FUNCTION IF EXISTS onceflow.effect_release(text, text);
DROP FUNCTION IF EXISTS onceflow.effect_record(text, text, integer, jsonb);
DROP FUNCTION IF EXISTS onceflow.effect_claim(text, text, text);
DROP TYPE IF EXISTS onceflow.effect_state;
DROP FUNCTION IF EXISTS onceflow.effect_held(text, text);
DROP FUNCTION IF EXISTS onceflow.effect_lock_id(text, text);
DROP FUNCTION IF EXISTS onceflow.effect_graph_key(text, text, text);
DROP FUNCTION IF EXISTS onceflow.effect_event_key(text);
DROP FUNCTION IF EXISTS onceflow.effect_part_error(text, text);
DROP FUNCTION IF EXISTS onceflow.effect_blank(text);
DROP FUNCTION IF EXISTS onceflow.effect_key_error(text);
-- PROVISIONAL (see the up migration): back to the key alone. Fails if two
-- scopes hold the same key, rather than dropping a row.
ALTER TABLE onceflow.effects DROP CONSTRAINT IF EXISTS effects_pkey;
ALTER TABLE onceflow.effects ADD CONSTRAINT effects_pkey PRIMARY KEY (idempotency_key);
ALTER TABLE onceflow.effects DROP COLUMN IF EXISTS scope;
