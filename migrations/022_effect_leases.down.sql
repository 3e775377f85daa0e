DROP FUNCTION IF EXISTS onceflow.effect_lease_release(text, text, text);
DROP FUNCTION IF EXISTS onceflow.effect_lease_record(text, text, integer, jsonb, text);
DROP FUNCTION IF EXISTS onceflow.effect_lease_claim(text, text, text, text, interval);
DROP TYPE IF EXISTS onceflow.effect_lease_state;
ALTER TABLE onceflow.effects
    DROP CONSTRAINT IF EXISTS effects_claimed_by_length,
    DROP COLUMN IF EXISTS lease_until,
    DROP COLUMN IF EXISTS claimed_by;
