-- Back to migrations 007 and 022. Refused while an effect is held: as an
-- intent again it would be sent by the next claim. Resolve or unhold it
-- first (`consumer effects resolve` / `unhold`).
DO $do$
BEGIN
    IF EXISTS (SELECT 1 FROM onceflow.effects WHERE status = 'held') THEN
        RAISE EXCEPTION 'onceflow: effects are held (SELECT scope, idempotency_key FROM onceflow.effects WHERE status = ''held''); resolve or unhold them before migrating down past 025'
            USING ERRCODE = '55000';
    END IF;
END
$do$;
DROP FUNCTION IF EXISTS onceflow.effect_unhold(text, text);
DROP FUNCTION IF EXISTS onceflow.effect_resolve(text, text, integer, jsonb);
DROP FUNCTION IF EXISTS onceflow.effect_hold(text, text, text);
DROP FUNCTION IF EXISTS onceflow.effect_window_age(text, text);
DROP INDEX IF EXISTS onceflow.effects_held;
-- The audit is append-only: its effect.* rows stay, so the narrower check
-- comes back NOT VALID (it holds for new rows only).
ALTER TABLE onceflow.admin_audit DROP CONSTRAINT admin_audit_action;
ALTER TABLE onceflow.admin_audit ADD CONSTRAINT admin_audit_action
    CHECK (action IN ('dlq.replay', 'gap.resolve', 'gap.give_up')) NOT VALID;
ALTER TABLE onceflow.effects
    DROP CONSTRAINT IF EXISTS effects_held_reason_length,
    DROP COLUMN IF EXISTS unheld_at,
    DROP COLUMN IF EXISTS held_reason,
    DROP COLUMN IF EXISTS held_at,
    DROP CONSTRAINT effects_status,
    ADD CONSTRAINT effects_status CHECK (status IN ('intent', 'done'));

CREATE OR REPLACE FUNCTION onceflow.effect_claim(key text, scope text DEFAULT '', event_id text DEFAULT NULL)
RETURNS onceflow.effect_state
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_err  text := onceflow.effect_key_error(effect_claim.key);
    v_lock integer;
    v      onceflow.effect_state;
BEGIN
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: %', v_err USING ERRCODE = '22023';
    END IF;
    IF effect_claim.scope IS NULL THEN
        RAISE EXCEPTION 'onceflow.effect_claim: scope is NULL (use '''' for none)' USING ERRCODE = '22023';
    END IF;
    -- Scopes as effects.ValidateScope: at most 512 bytes, no control characters.
    IF octet_length(effect_claim.scope) > 512 THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: scope is % bytes, at most 512', octet_length(effect_claim.scope)
            USING ERRCODE = '22023';
    END IF;
    IF effect_claim.scope ~ '[\x01-\x1f\x7f]' THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: scope contains a control character' USING ERRCODE = '22023';
    END IF;
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow.effect_claim: called in a transaction that has already written; claim on a connection of its own, outside the business transaction, so that the intent commits before the call'
            USING ERRCODE = '25001';
    END IF;
    IF onceflow.effect_held(effect_claim.scope, effect_claim.key) THEN
        RAISE EXCEPTION 'onceflow.effect_claim: this session already holds key % (or one with the same lock hash); claim each key on a connection of its own', quote_literal(effect_claim.key)
            USING ERRCODE = '55000';
    END IF;
    v_lock := onceflow.effect_lock_id(effect_claim.scope, effect_claim.key);
    PERFORM pg_advisory_lock(3839, v_lock);
    BEGIN
        INSERT INTO onceflow.effects AS e (scope, idempotency_key, event_id, status, attempts)
        VALUES (effect_claim.scope, effect_claim.key, effect_claim.event_id, 'intent', 1)
        ON CONFLICT (scope, idempotency_key) DO UPDATE
           SET attempts = e.attempts + CASE WHEN e.status = 'intent' THEN 1 ELSE 0 END,
               event_id = COALESCE(e.event_id, EXCLUDED.event_id)
        RETURNING e.status, e.attempts, e.result_code, e.result
             INTO v.status, v.attempts, v.result_code, v.result;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        PERFORM pg_advisory_unlock(3839, v_lock);
        RAISE;
    END;
    IF v.status = 'done' THEN
        PERFORM pg_advisory_unlock(3839, v_lock);
    END IF;
    RETURN v;
END
$fn$;

CREATE OR REPLACE FUNCTION onceflow.effect_lease_claim(key text, scope text, event_id text, owner text, lease interval)
RETURNS onceflow.effect_lease_state
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_err text := onceflow.effect_key_error(effect_lease_claim.key);
    v     onceflow.effect_lease_state;
BEGIN
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: %', v_err USING ERRCODE = '22023';
    END IF;
    IF effect_lease_claim.scope IS NULL THEN
        RAISE EXCEPTION 'onceflow.effect_lease_claim: scope is NULL (use '''' for none)' USING ERRCODE = '22023';
    END IF;
    IF octet_length(effect_lease_claim.scope) > 512 THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: scope is % bytes, at most 512', octet_length(effect_lease_claim.scope)
            USING ERRCODE = '22023';
    END IF;
    IF effect_lease_claim.scope ~ '[\x01-\x1f\x7f]' THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: scope contains a control character' USING ERRCODE = '22023';
    END IF;
    IF effect_lease_claim.owner IS NULL OR effect_lease_claim.owner = '' OR octet_length(effect_lease_claim.owner) > 512 THEN
        RAISE EXCEPTION 'onceflow.effect_lease_claim: owner must be 1 to 512 bytes' USING ERRCODE = '22023';
    END IF;
    IF effect_lease_claim.lease IS NULL OR effect_lease_claim.lease <= interval '0' THEN
        RAISE EXCEPTION 'onceflow.effect_lease_claim: lease must be positive, got %', effect_lease_claim.lease USING ERRCODE = '22023';
    END IF;
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow.effect_lease_claim: called in a transaction that has already written; claim in a transaction of its own, so that the claim commits before the call'
            USING ERRCODE = '25001';
    END IF;
    -- A caller of the session-lock protocol (effect_claim) is in its call.
    IF NOT pg_try_advisory_xact_lock(3839, onceflow.effect_lock_id(effect_lease_claim.scope, effect_lease_claim.key)) THEN
        SELECT 'busy', e.attempts, NULL, NULL, e.claimed_by, now() + interval '1 second'
          INTO v FROM onceflow.effects e
         WHERE e.scope = effect_lease_claim.scope AND e.idempotency_key = effect_lease_claim.key;
        v.status := 'busy';
        v.lease_until := now() + interval '1 second';
        RETURN v;
    END IF;
    INSERT INTO onceflow.effects AS e (scope, idempotency_key, event_id, status, attempts, claimed_by, lease_until)
    VALUES (effect_lease_claim.scope, effect_lease_claim.key, effect_lease_claim.event_id, 'intent', 1,
            effect_lease_claim.owner, now() + effect_lease_claim.lease)
    ON CONFLICT (scope, idempotency_key) DO UPDATE
       SET attempts = e.attempts + 1,
           claimed_by = EXCLUDED.claimed_by,
           lease_until = EXCLUDED.lease_until,
           event_id = COALESCE(e.event_id, EXCLUDED.event_id)
     WHERE e.status = 'intent'
       AND (e.claimed_by IS NULL OR e.claimed_by = EXCLUDED.claimed_by OR e.lease_until IS NULL OR e.lease_until <= now())
    RETURNING 'claimed', e.attempts, e.result_code, e.result, e.claimed_by, e.lease_until INTO v;
    IF FOUND THEN
        RETURN v;
    END IF;
    -- Done, or claimed by another owner whose lease runs (the conflicting
    -- row is locked by the statement above: this read is current).
    SELECT CASE WHEN e.status = 'done' THEN 'done' ELSE 'busy' END, e.attempts, e.result_code, e.result, e.claimed_by, e.lease_until
      INTO v FROM onceflow.effects e
     WHERE e.scope = effect_lease_claim.scope AND e.idempotency_key = effect_lease_claim.key;
    RETURN v;
END
$fn$;
