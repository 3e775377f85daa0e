-- effect_claim (the session-lock protocol of effects.Do, migration 007; 025
-- made it refuse held keys) waits for a claimant of the lease protocol
-- (migration 022) as a lease claim already waits for a session-lock holder:
-- while another claimant's lease on an intent runs, it answers status
-- 'busy' and changes nothing. Before, a Do on a key that the Python fence
-- (or DoLeased, or the http handler) had claimed and was calling found no
-- lock, took the intent and called a second time.
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
    -- A claimant of the lease protocol (effect_lease_claim: the Python
    -- fence, effects.DoLeased, the http handler) makes its call holding no
    -- lock: while its lease runs, the key is busy. Answer 'busy' (nothing
    -- changed, the lock let go); the caller claims again later (effects.Do
    -- waits). The advisory lock taken above keeps a new lease claim out
    -- meanwhile, so the answer cannot go stale before it is given.
    SELECT 'busy', e.attempts, NULL::integer, NULL::jsonb INTO v
      FROM onceflow.effects e
     WHERE e.scope = effect_claim.scope AND e.idempotency_key = effect_claim.key
       AND e.status = 'intent' AND e.claimed_by IS NOT NULL AND e.lease_until > now();
    IF FOUND THEN
        PERFORM pg_advisory_unlock(3839, v_lock);
        RETURN v;
    END IF;
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
    IF v.status <> 'intent' THEN
        PERFORM pg_advisory_unlock(3839, v_lock);
    END IF;
    IF v.status = 'held' THEN
        -- The session lock is released above (it is not transactional); the
        -- error rolls the statement back, so a refused claim changes nothing.
        RAISE EXCEPTION 'onceflow: effect % in scope % is held for an operator (its retry came after the downstream''s idempotency window); resolve it with onceflow.effect_resolve or let it send with onceflow.effect_unhold',
            quote_literal(effect_claim.key), quote_literal(effect_claim.scope)
            USING ERRCODE = 'OFH01';
    END IF;
    RETURN v;
END
$fn$;
