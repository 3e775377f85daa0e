-- The effects ledger's lease protocol (docs/effects.md, "Claims with a
-- lease"): a slow downstream call holds no PostgreSQL transaction or
-- connection while it runs.
--
--   SELECT * FROM onceflow.effect_lease_claim(key, scope, event_id, owner, lease);
--       status 'done'    → the recorded result; do not call.
--       status 'claimed' → the intent is recorded, claimed by owner until
--                          lease_until: call the downstream with the key
--                          (no transaction, no connection needed), then
--   SELECT onceflow.effect_lease_record(key, scope, result_code, result, event_id);
--       → status done; may run inside the business transaction (the inbox
--         transaction of the event), so that the result commits with it.
--   status 'busy'        → another owner's lease runs until lease_until: do
--                          not call; claim again later (it ends as done, or
--                          its lease expires and the next claim takes it).
--   SELECT onceflow.effect_lease_release(key, scope, owner);
--       → after a failed call: the intent stays, the lease is dropped.
--
-- A claim commits on its own (autocommit), never inside the business
-- transaction. A crash between claim and record leaves the intent claimed:
-- the same owner (a restarted static consumer) claims it again at once, any
-- other owner once the lease has expired; either calls again with the same
-- key and the downstream dedups. The session-lock protocol of migration 007
-- (effect_claim, effect_record, effect_release) is unchanged; while one of
-- its sessions holds a key, a lease claim of that key is busy.
ALTER TABLE onceflow.effects
    ADD COLUMN claimed_by text,
    ADD COLUMN lease_until timestamptz,
    ADD CONSTRAINT effects_claimed_by_length CHECK (octet_length(claimed_by) <= 512);

CREATE TYPE onceflow.effect_lease_state AS (
    status      text,        -- claimed | busy | done
    attempts    integer,
    result_code integer,
    result      jsonb,
    claimed_by  text,
    lease_until timestamptz
);

CREATE FUNCTION onceflow.effect_lease_claim(key text, scope text, event_id text, owner text, lease interval)
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

-- effect_lease_record: the call succeeded; record its result (status done).
-- Returns true when it recorded, false when the key was done already (a
-- claimant that took over an expired lease recorded first: the first result
-- is kept; both calls carried the same key). Runs in any transaction, the
-- business one included. A missing row (a claim lost in a database crash
-- before it reached the disk) is inserted done: the call was made with the
-- key whatever became of its claim.
CREATE FUNCTION onceflow.effect_lease_record(key text, scope text, result_code integer, result jsonb, event_id text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_err text := onceflow.effect_key_error(effect_lease_record.key);
BEGIN
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: %', v_err USING ERRCODE = '22023';
    END IF;
    IF effect_lease_record.scope IS NULL THEN
        RAISE EXCEPTION 'onceflow.effect_lease_record: scope is NULL (use '''' for none)' USING ERRCODE = '22023';
    END IF;
    INSERT INTO onceflow.effects AS e (scope, idempotency_key, event_id, status, attempts, result_code, result, completed_at)
    VALUES (effect_lease_record.scope, effect_lease_record.key, effect_lease_record.event_id, 'done', 1,
            effect_lease_record.result_code, effect_lease_record.result, now())
    ON CONFLICT (scope, idempotency_key) DO UPDATE
       SET status = 'done', result_code = EXCLUDED.result_code, result = EXCLUDED.result,
           completed_at = EXCLUDED.completed_at, claimed_by = NULL, lease_until = NULL,
           event_id = COALESCE(e.event_id, EXCLUDED.event_id)
     WHERE e.status = 'intent';
    RETURN FOUND;
END
$fn$;

-- effect_lease_release: the call failed; drop owner's lease (the intent
-- stays, and the next claim calls again with the same key). Returns whether
-- owner held it.
CREATE FUNCTION onceflow.effect_lease_release(key text, scope text, owner text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    UPDATE onceflow.effects AS e
       SET claimed_by = NULL, lease_until = NULL
     WHERE e.scope = effect_lease_release.scope AND e.idempotency_key = effect_lease_release.key
       AND e.status = 'intent' AND e.claimed_by = effect_lease_release.owner;
    RETURN FOUND;
END
$fn$;
