-- Back to one unpartitioned onceflow.effects: the rows of the buckets and
-- of the default partition move into the legacy partition (ACCESS
-- EXCLUSIVE on onceflow.effects for the whole transaction: claims wait),
-- which becomes onceflow.effects again, and the functions of migrations
-- 007 to 027 come back (they use INSERT ... ON CONFLICT on its key).
LOCK TABLE onceflow.effects IN ACCESS EXCLUSIVE MODE;
INSERT INTO onceflow.effects_legacy (idempotency_key, event_id, status, attempts, result_code, result, created_at, completed_at,
    scope, claimed_by, lease_until, held_at, held_reason, unheld_at, owner)
SELECT idempotency_key, event_id, status, attempts, result_code, result, created_at, completed_at,
    scope, claimed_by, lease_until, held_at, held_reason, unheld_at, ''
FROM onceflow.effects WHERE owner <> '';
ALTER TABLE onceflow.effects DETACH PARTITION onceflow.effects_legacy;
DROP TABLE onceflow.effects;
ALTER TABLE onceflow.effects_legacy RENAME TO effects;
ALTER TABLE onceflow.effects RENAME CONSTRAINT effects_legacy_pkey TO effects_pkey;
ALTER INDEX onceflow.effects_legacy_created_at RENAME TO effects_created_at;
ALTER INDEX onceflow.effects_legacy_event_id RENAME TO effects_event_id;
ALTER INDEX onceflow.effects_legacy_held RENAME TO effects_held;
ALTER TABLE onceflow.effects DROP CONSTRAINT effects_legacy_key;
ALTER TABLE onceflow.effects DROP CONSTRAINT effects_legacy_owner;
ALTER TABLE onceflow.effects DROP COLUMN owner;
DROP FUNCTION onceflow.effects_drop_bucket(text, timestamptz);
DROP FUNCTION onceflow.effects_expire_bucket(text, text, timestamptz);
DROP FUNCTION onceflow.effects_keep_bucket_rows(text, text, timestamptz);
DROP FUNCTION onceflow.effects_inbox_lanes(text);
DROP FUNCTION onceflow.effects_ensure_buckets(text, bigint, timestamptz);
DROP FUNCTION onceflow.effects_bucket_width(bigint);
DROP TABLE onceflow.effects_buckets;

-- effect_claim, as migration 027 made it.
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

-- effect_lease_claim, as migration 025 made it.
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

-- effect_lease_record, as migration 022 made it.
CREATE OR REPLACE FUNCTION onceflow.effect_lease_record(key text, scope text, result_code integer, result jsonb, event_id text DEFAULT NULL)
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

-- effect_lease_claim_many, as migration 026 made it.
CREATE OR REPLACE FUNCTION onceflow.effect_lease_claim_many(keys text[], scopes text[], event_ids text[], owners text[], leases interval[])
RETURNS TABLE (i integer, status text, attempts integer, result_code integer, result jsonb, claimed_by text, lease_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    n        integer := coalesce(cardinality(keys), 0);
    r        record;
    v_free   boolean[];
    v_scopes text[];
    v_keys   text[];
BEGIN
    IF coalesce(cardinality(scopes), 0) <> n OR coalesce(cardinality(event_ids), 0) <> n
       OR coalesce(cardinality(owners), 0) <> n OR coalesce(cardinality(leases), 0) <> n THEN
        RAISE EXCEPTION 'onceflow.effect_lease_claim_many: keys, scopes, event_ids, owners and leases must have one element each per claim (got %, %, %, %, %)',
            n, coalesce(cardinality(scopes), 0), coalesce(cardinality(event_ids), 0), coalesce(cardinality(owners), 0), coalesce(cardinality(leases), 0)
            USING ERRCODE = '22023';
    END IF;
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow.effect_lease_claim_many: called in a transaction that has already written; claim in a transaction of its own, so that the claims commit before the calls'
            USING ERRCODE = '25001';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    -- Every argument is checked before anything is claimed: a bad element
    -- fails the group, and nothing of it is claimed.
    SELECT u.ord, u.scope, u.owner, u.lease, onceflow.effect_key_error(u.key) AS key_error INTO r
      FROM unnest(keys, scopes, owners, leases) WITH ORDINALITY AS u(key, scope, owner, lease, ord)
     WHERE onceflow.effect_key_error(u.key) IS NOT NULL
        OR u.scope IS NULL OR octet_length(u.scope) > 512 OR u.scope ~ '[\x01-\x1f\x7f]'
        OR u.owner IS NULL OR u.owner = '' OR octet_length(u.owner) > 512
        OR u.lease IS NULL OR u.lease <= interval '0'
     ORDER BY u.ord
     LIMIT 1;
    IF FOUND THEN
        IF r.key_error IS NOT NULL THEN
            RAISE EXCEPTION 'onceflow: invalid idempotency key (claim %): %', r.ord, r.key_error USING ERRCODE = '22023';
        ELSIF r.scope IS NULL THEN
            RAISE EXCEPTION 'onceflow.effect_lease_claim_many: scope of claim % is NULL (use '''' for none)', r.ord USING ERRCODE = '22023';
        ELSIF octet_length(r.scope) > 512 THEN
            RAISE EXCEPTION 'onceflow: invalid idempotency key (claim %): scope is % bytes, at most 512', r.ord, octet_length(r.scope)
                USING ERRCODE = '22023';
        ELSIF r.scope ~ '[\x01-\x1f\x7f]' THEN
            RAISE EXCEPTION 'onceflow: invalid idempotency key (claim %): scope contains a control character', r.ord USING ERRCODE = '22023';
        ELSIF r.owner IS NULL OR r.owner = '' OR octet_length(r.owner) > 512 THEN
            RAISE EXCEPTION 'onceflow.effect_lease_claim_many: owner of claim % must be 1 to 512 bytes', r.ord USING ERRCODE = '22023';
        ELSE
            RAISE EXCEPTION 'onceflow.effect_lease_claim_many: lease of claim % must be positive, got %', r.ord, r.lease USING ERRCODE = '22023';
        END IF;
    END IF;
    -- A caller of the session-lock protocol (effect_claim) is in its call:
    -- the keys it holds are busy (effect_lease_claim's first step, per key;
    -- a key given twice takes its lock twice, which its own transaction may).
    SELECT array_agg(f.free ORDER BY f.ord) INTO v_free
      FROM (SELECT u.ord, pg_try_advisory_xact_lock(3839, onceflow.effect_lock_id(u.scope, u.key)) AS free
              FROM unnest(keys, scopes) WITH ORDINALITY AS u(key, scope, ord)) f;
    -- The claims: new keys, intents nobody holds, this owner's own, and
    -- those whose lease has expired (effect_lease_claim's rules).
    WITH req AS (
        SELECT DISTINCT ON (u.scope, u.key) u.key, u.scope, u.event_id, u.owner, u.lease
          FROM unnest(keys, scopes, event_ids, owners, leases) WITH ORDINALITY AS u(key, scope, event_id, owner, lease, ord)
         WHERE v_free[u.ord]
         ORDER BY u.scope, u.key, u.ord
    ), ins AS (
        INSERT INTO onceflow.effects AS e (scope, idempotency_key, event_id, status, attempts, claimed_by, lease_until)
        SELECT q.scope, q.key, q.event_id, 'intent', 1, q.owner, now() + q.lease FROM req q ORDER BY q.scope, q.key
        ON CONFLICT (scope, idempotency_key) DO UPDATE
           SET attempts = e.attempts + 1,
               claimed_by = EXCLUDED.claimed_by,
               lease_until = EXCLUDED.lease_until,
               event_id = COALESCE(e.event_id, EXCLUDED.event_id)
         WHERE e.status = 'intent'
           AND (e.claimed_by IS NULL OR e.claimed_by = EXCLUDED.claimed_by OR e.lease_until IS NULL OR e.lease_until <= now())
        RETURNING e.scope, e.idempotency_key
    )
    SELECT array_agg(ins.scope), array_agg(ins.idempotency_key) INTO v_scopes, v_keys FROM ins;
    -- The answers, read after the claims (a new snapshot: the rows the
    -- claims did not take were locked by them, so this read is current).
    RETURN QUERY
    SELECT u.ord::integer,
           CASE WHEN NOT v_free[u.ord] THEN 'busy'
                WHEN c.key IS NOT NULL THEN 'claimed'
                WHEN e.status IN ('done', 'held') THEN e.status
                ELSE 'busy' END,
           e.attempts,
           CASE WHEN v_free[u.ord] THEN e.result_code END,
           CASE WHEN v_free[u.ord] THEN e.result END,
           e.claimed_by,
           CASE WHEN v_free[u.ord] THEN e.lease_until ELSE now() + interval '1 second' END
      FROM unnest(keys, scopes) WITH ORDINALITY AS u(key, scope, ord)
      LEFT JOIN onceflow.effects e ON e.scope = u.scope AND e.idempotency_key = u.key
      LEFT JOIN (SELECT DISTINCT x.scope, x.key FROM unnest(v_scopes, v_keys) AS x(scope, key)) c
             ON c.scope = u.scope AND c.key = u.key
     ORDER BY u.ord;
END
$fn$;

-- effect_record, as migration 007 made it.
CREATE OR REPLACE FUNCTION onceflow.effect_record(key text, scope text DEFAULT '', result_code integer DEFAULT NULL, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    IF effect_record.key IS NULL OR effect_record.scope IS NULL
       OR NOT onceflow.effect_held(effect_record.scope, effect_record.key) THEN
        RAISE EXCEPTION 'onceflow.effect_record: key % is not claimed by this session (claim it with onceflow.effect_claim on the same connection)', quote_literal(effect_record.key)
            USING ERRCODE = '55000';
    END IF;
    UPDATE onceflow.effects AS e
       SET status = 'done', result_code = effect_record.result_code, result = effect_record.result, completed_at = now()
     WHERE e.scope = effect_record.scope AND e.idempotency_key = effect_record.key AND e.status = 'intent';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'onceflow.effect_record: no intent for key % in scope %', quote_literal(effect_record.key), quote_literal(effect_record.scope)
            USING ERRCODE = '55000';
    END IF;
    PERFORM pg_advisory_unlock(3839, onceflow.effect_lock_id(effect_record.scope, effect_record.key));
END
$fn$;

-- effect_lease_release, as migration 022 made it.
CREATE OR REPLACE FUNCTION onceflow.effect_lease_release(key text, scope text, owner text)
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

-- effect_window_age, as migration 025 made it.
CREATE OR REPLACE FUNCTION onceflow.effect_window_age(key text, scope text)
RETURNS interval
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT now() - COALESCE(e.unheld_at, e.created_at)
      FROM onceflow.effects e
     WHERE e.scope = effect_window_age.scope AND e.idempotency_key = effect_window_age.key
$fn$;

-- effect_hold, as migration 025 made it.
CREATE OR REPLACE FUNCTION onceflow.effect_hold(key text, scope text, reason text)
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

-- effect_resolve, as migration 025 made it.
CREATE OR REPLACE FUNCTION onceflow.effect_resolve(key text, scope text, result_code integer DEFAULT NULL, result jsonb DEFAULT NULL)
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

-- effect_unhold, as migration 025 made it.
CREATE OR REPLACE FUNCTION onceflow.effect_unhold(key text, scope text)
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

DROP FUNCTION onceflow.effect_new_key_check(text);
DROP FUNCTION onceflow.effect_insert_owner(text);
DROP FUNCTION onceflow.effect_row_owner(text, text);
DROP FUNCTION onceflow.effect_owner(text);
