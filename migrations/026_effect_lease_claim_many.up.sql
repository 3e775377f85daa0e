-- Group claims (docs/effects.md, "Claims in groups"): effect_lease_claim_many
-- claims several keys in one statement, one round trip and one commit, with
-- the same rules per key as effect_lease_claim (migration 022). A consumer
-- making many slow calls at once sends the claims that are waiting together
-- instead of one statement (and one pooled connection) per call.
--
--   SELECT * FROM onceflow.effect_lease_claim_many(keys, scopes, event_ids, owners, leases);
--       one row per element, i its 1-based position in the arrays, and the
--       same columns as effect_lease_claim's answer.
--
-- A held key (migration 025) is not claimed and answers status 'held' (a
-- single claim raises SQLSTATE OFH01 for it; a group answers for each key,
-- and the caller turns the answer into the same error).
--
-- Set-based: one INSERT ... ON CONFLICT for the group, then one read of the
-- answers. The rows are written in (scope, key) order, so that two group
-- claims with keys in common cannot deadlock on the ledger's rows; a key
-- given twice is claimed once and answered twice. Like a single claim, a
-- group claim commits on its own: it is refused in a transaction that has
-- already written.
CREATE FUNCTION onceflow.effect_lease_claim_many(keys text[], scopes text[], event_ids text[], owners text[], leases interval[])
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
