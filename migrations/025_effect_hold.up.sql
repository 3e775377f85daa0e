-- Held effects (docs/effects.md, "Downstream idempotency windows"): a
-- downstream dedups a key only for a while (Stripe: 24 hours). A retry of
-- an intent whose first attempt is older than that window is never sent
-- blindly: the fence asks the downstream by key (a reconcile hook) or holds
-- the effect for an operator.
--
--   SELECT onceflow.effect_hold(key, scope, reason);
--       → status held (from intent): every claim of the key is refused with
--         SQLSTATE OFH01 until an operator decides, with
--   SELECT onceflow.effect_resolve(key, scope, result_code, result);
--       → status done with the result the operator found downstream: every
--         later claim replays it, nothing is sent; or
--   SELECT onceflow.effect_unhold(key, scope);
--       → status intent again, the window restarts now: the next claim
--         sends (with the same key).
--   SELECT onceflow.effect_window_age(key, scope);
--       → how long ago the window of the key's row began: its first claim,
--         or the last effect_unhold.
ALTER TABLE onceflow.effects
    DROP CONSTRAINT effects_status,
    ADD CONSTRAINT effects_status CHECK (status IN ('intent', 'done', 'held')),
    ADD COLUMN held_at timestamptz,
    ADD COLUMN held_reason text,
    -- When an operator last let a held effect send (effect_unhold): the
    -- downstream's window counts from there rather than from created_at.
    ADD COLUMN unheld_at timestamptz,
    ADD CONSTRAINT effects_held_reason_length CHECK (octet_length(held_reason) <= 2048);

-- An operator's resolve and unhold are audited like the other changes
-- (`consumer effects resolve|unhold`, the console).
ALTER TABLE onceflow.admin_audit DROP CONSTRAINT admin_audit_action;
ALTER TABLE onceflow.admin_audit ADD CONSTRAINT admin_audit_action
    CHECK (action IN ('dlq.replay', 'gap.resolve', 'gap.give_up', 'effect.resolve', 'effect.unhold')) NOT VALID;
ALTER TABLE onceflow.admin_audit VALIDATE CONSTRAINT admin_audit_action;

-- Operators list held effects by scope (the consumer's gauge, `consumer
-- effects held`); a partial index keeps that cheap on a large ledger.
CREATE INDEX effects_held ON onceflow.effects (scope, held_at) WHERE status = 'held';

-- effect_claim (migration 007) refuses a held key: SQLSTATE OFH01. The rest
-- is unchanged.
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

-- effect_lease_claim (migration 022) refuses a held key the same way.
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
    -- Done, held, or claimed by another owner whose lease runs (the
    -- conflicting row is locked by the statement above: this read is current).
    SELECT CASE WHEN e.status IN ('done', 'held') THEN e.status ELSE 'busy' END, e.attempts, e.result_code, e.result, e.claimed_by, e.lease_until
      INTO v FROM onceflow.effects e
     WHERE e.scope = effect_lease_claim.scope AND e.idempotency_key = effect_lease_claim.key;
    IF v.status = 'held' THEN
        RAISE EXCEPTION 'onceflow: effect % in scope % is held for an operator (its retry came after the downstream''s idempotency window); resolve it with onceflow.effect_resolve or let it send with onceflow.effect_unhold',
            quote_literal(effect_lease_claim.key), quote_literal(effect_lease_claim.scope)
            USING ERRCODE = 'OFH01';
    END IF;
    RETURN v;
END
$fn$;

-- effect_window_age: how long ago the downstream's window of the key began
-- (its first claim, or the last effect_unhold); NULL when there is no row.
CREATE FUNCTION onceflow.effect_window_age(key text, scope text)
RETURNS interval
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT now() - COALESCE(e.unheld_at, e.created_at)
      FROM onceflow.effects e
     WHERE e.scope = effect_window_age.scope AND e.idempotency_key = effect_window_age.key
$fn$;

-- effect_hold: stop an intent for an operator (status held, with why).
-- The claimant that decided not to call runs it (a fence whose retry is
-- past the window and has no reconcile hook); it drops the claim (lease and,
-- if this session holds it, the key's session lock). Returns false when
-- there is no intent to hold (done, held already, or no row).
CREATE FUNCTION onceflow.effect_hold(key text, scope text, reason text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_found boolean;
BEGIN
    IF effect_hold.key IS NULL OR effect_hold.scope IS NULL THEN
        RAISE EXCEPTION 'onceflow.effect_hold: key and scope must not be NULL' USING ERRCODE = '22023';
    END IF;
    IF effect_hold.reason IS NULL OR btrim(effect_hold.reason) = '' OR octet_length(effect_hold.reason) > 2048 THEN
        RAISE EXCEPTION 'onceflow.effect_hold: reason must be 1 to 2048 bytes, not blank' USING ERRCODE = '22023';
    END IF;
    UPDATE onceflow.effects AS e
       SET status = 'held', held_at = now(), held_reason = effect_hold.reason, claimed_by = NULL, lease_until = NULL
     WHERE e.scope = effect_hold.scope AND e.idempotency_key = effect_hold.key AND e.status = 'intent';
    v_found := FOUND;
    IF onceflow.effect_held(effect_hold.scope, effect_hold.key) THEN
        PERFORM pg_advisory_unlock(3839, onceflow.effect_lock_id(effect_hold.scope, effect_hold.key));
    END IF;
    RETURN v_found;
END
$fn$;

-- effect_resolve: an operator found out what the downstream did and records
-- it (status done): every later claim replays this result, nothing is sent.
CREATE FUNCTION onceflow.effect_resolve(key text, scope text, result_code integer DEFAULT NULL, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_status text;
BEGIN
    UPDATE onceflow.effects AS e
       SET status = 'done', result_code = effect_resolve.result_code, result = effect_resolve.result, completed_at = now()
     WHERE e.scope = effect_resolve.scope AND e.idempotency_key = effect_resolve.key AND e.status = 'held';
    IF NOT FOUND THEN
        SELECT e.status INTO v_status FROM onceflow.effects e
         WHERE e.scope = effect_resolve.scope AND e.idempotency_key = effect_resolve.key;
        RAISE EXCEPTION 'onceflow.effect_resolve: effect % in scope % is not held (%)', quote_literal(effect_resolve.key),
            quote_literal(effect_resolve.scope), COALESCE('status ' || v_status, 'no such effect')
            USING ERRCODE = '55000';
    END IF;
END
$fn$;

-- effect_unhold: an operator lets a held effect send: status intent again,
-- the window restarts now (unheld_at), so the next claim sends with the
-- same key.
CREATE FUNCTION onceflow.effect_unhold(key text, scope text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_status text;
BEGIN
    UPDATE onceflow.effects AS e
       SET status = 'intent', unheld_at = now()
     WHERE e.scope = effect_unhold.scope AND e.idempotency_key = effect_unhold.key AND e.status = 'held';
    IF NOT FOUND THEN
        SELECT e.status INTO v_status FROM onceflow.effects e
         WHERE e.scope = effect_unhold.scope AND e.idempotency_key = effect_unhold.key;
        RAISE EXCEPTION 'onceflow.effect_unhold: effect % in scope % is not held (%)', quote_literal(effect_unhold.key),
            quote_literal(effect_unhold.scope), COALESCE('status ' || v_status, 'no such effect')
            USING ERRCODE = '55000';
    END IF;
END
$fn$;
