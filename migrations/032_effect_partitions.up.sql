---- tern: disable-tx ----
-- The effects ledger becomes a table partitioned by RANGE (owner, created_at),
-- so that retention removes a consumer's old effects whole (TRUNCATE, DROP)
-- instead of deleting them row by row (docs/effects.md, "Storage layout").
--
--   owner       the consumer whose scope the row is in, as its scope prefix
--               'inbox/<escaped consumer>/' (onceflow.effect_owner), or ''
--               for every other scope and for the rows of the table before
--               this migration; the rows of owner '' lie in the partition
--               onceflow.effects_legacy (the old table), which retention
--               prunes row by row, as before; rows retention keeps out of
--               an expired bucket move there too.
--   created_at  the time of the row's first claim: it picks the time bucket.
--
-- The key stays (scope, idempotency_key): the partitioned table's unique
-- key must hold the partition key, so every function that inserts a row
-- first takes the transaction advisory lock of the key (class x'0e1e'),
-- then probes the partitions of the key's owner and the legacy partition
-- (partition-pruned by owner) with SELECT ... FOR UPDATE, and inserts only
-- when the probe found nothing. The lock makes a second inserter of the
-- key wait for the first's commit; its probe, a statement that starts after
-- the lock is granted, then sees the first's row.
--
-- The steps run in separate transactions (this file runs without an
-- enclosing one), each taking one short lock; the application keeps running:
--   1. the column owner with a constant default and a NOT VALID check:
--      ACCESS EXCLUSIVE on onceflow.effects for a catalog update (no rewrite);
--   1b. the ledger's functions are replaced by versions that work on the
--      plain table and on the partitioned one: no lock on the table;
--   2. VALIDATE the check: SHARE UPDATE EXCLUSIVE (a scan; reads and writes
--      go on);
--   3. CREATE UNIQUE INDEX CONCURRENTLY of the partitioned table's key:
--      SHARE UPDATE EXCLUSIVE (writes go on);
--   4. the buckets' table and functions: no lock on the ledger;
--   5. last, one transaction renames the table to onceflow.effects_legacy,
--      creates the partitioned onceflow.effects with the same columns,
--      grants, checks and indexes, attaches the old table as the partition
--      of owner '' (the validated check spares the scan, the existing
--      indexes become the partition's), creates the default partition, and
--      new rows get their scope's owner: ACCESS EXCLUSIVE on the old table
--      for catalog work only. Until it commits, every step may be run
--      again (IF NOT EXISTS, checks of the table's kind).
-- No caller runs an INSERT ... ON CONFLICT against the partitioned table:
-- a claim under way at step 5 waits for its lock and goes on with the
-- functions of step 1b. A process that reads the ledger with its own
-- statements (effects.Do's replay read, the Python fence) keeps working
-- between the steps.

SET lock_timeout = '10s';

DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.effects'::regclass) = 'r' THEN
        ALTER TABLE onceflow.effects ADD COLUMN IF NOT EXISTS owner text NOT NULL DEFAULT '';
        IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'onceflow.effects'::regclass AND conname = 'effects_legacy_owner') THEN
            ALTER TABLE onceflow.effects ADD CONSTRAINT effects_legacy_owner CHECK (owner = '') NOT VALID;
        END IF;
    END IF;
END $$;

-- Step 1b: the ledger's functions.

-- The owner of a scope: its consumer's prefix 'inbox/<escaped consumer>/'
-- (effects.ConsumerScopePrefix; an escaped name holds no '/'), else ''.
CREATE OR REPLACE FUNCTION onceflow.effect_owner(scope text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT coalesce(substring(scope FROM '^inbox/[^/]*/'), '')
$fn$;

-- The owner column of the row of (scope, key): the scope's owner when the
-- row lies in one of its partitions, '' when it lies in the legacy one,
-- NULL when there is none. Two probes, each one index descent per
-- partition of one owner: a statement that then names the row with
-- owner = this value reads only those partitions.
CREATE OR REPLACE FUNCTION onceflow.effect_row_owner(scope text, key text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_owner text := onceflow.effect_owner(effect_row_owner.scope);
BEGIN
    IF v_owner <> '' AND EXISTS (SELECT 1 FROM onceflow.effects e
                                  WHERE e.owner = v_owner AND e.scope = effect_row_owner.scope AND e.idempotency_key = effect_row_owner.key) THEN
        RETURN v_owner;
    END IF;
    IF EXISTS (SELECT 1 FROM onceflow.effects e
                WHERE e.owner = '' AND e.scope = effect_row_owner.scope AND e.idempotency_key = effect_row_owner.key) THEN
        RETURN '';
    END IF;
    RETURN NULL;
END
$fn$;

-- A new key is inserted only in a READ COMMITTED transaction: the probe
-- of the key's partitions must see the rows committed while it waited for
-- the key's lock, which a REPEATABLE READ or SERIALIZABLE snapshot taken
-- before the wait does not (an INSERT ... ON CONFLICT raised a
-- serialization failure there; a probe would miss the row and insert the
-- key twice). SQLSTATE 0A000: retrying in the same isolation would fail
-- again.
CREATE OR REPLACE FUNCTION onceflow.effect_new_key_check(fn text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'onceflow.%: a new idempotency key is recorded only in a READ COMMITTED transaction (this one is %)', fn, current_setting('transaction_isolation')
            USING ERRCODE = '0A000';
    END IF;
END
$fn$;

-- The owner a new row is given: '' while onceflow.effects is still the
-- plain table (its rows all have owner ''), then the scope's owner (the
-- last step replaces this function by onceflow.effect_owner alone).
CREATE OR REPLACE FUNCTION onceflow.effect_insert_owner(scope text)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT CASE WHEN (SELECT c.relkind FROM pg_class c WHERE c.oid = 'onceflow.effects'::regclass) = 'p'
                THEN onceflow.effect_owner(scope) ELSE '' END
$fn$;

-- The inserting functions: every INSERT ... ON CONFLICT (scope,
-- idempotency_key) becomes the key's advisory lock, a probe of its owner's
-- partitions and the legacy one, and an INSERT or an UPDATE. Their
-- arguments, answers, errors and the session-lock and lease protocols are
-- unchanged. They are replaced before the table is, and work on both: on
-- the plain table they insert owner '' (effect_insert_owner), and a call
-- under way when the table is swapped (waiting for its lock) goes on
-- against the partitioned one, where an ON CONFLICT on the old key would
-- fail.
--
-- The functions that read the ledger plan each statement for its
-- arguments (plan_cache_mode = force_custom_plan): the planner prunes the
-- other owners' partitions and locks only the key's owner's. A cached
-- generic plan would lock every partition of the ledger at each call, and
-- so wait while retention holds any owner's bucket (its expiry takes
-- ACCESS EXCLUSIVE on it).

-- effect_claim (migrations 007, 025, 027).
CREATE OR REPLACE FUNCTION onceflow.effect_claim(key text, scope text DEFAULT '', event_id text DEFAULT NULL)
RETURNS onceflow.effect_state
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_err   text := onceflow.effect_key_error(effect_claim.key);
    v_lock  integer;
    v_owner text;
    v_new   boolean;
    r       record;
    v       onceflow.effect_state;
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
    v_owner := onceflow.effect_owner(effect_claim.scope);
    PERFORM pg_advisory_lock(3839, v_lock);
    BEGIN
        -- The key's inserters one at a time; then its row, wherever it lies.
        PERFORM pg_advisory_xact_lock(x'0e1e'::integer, v_lock);
        SELECT e.owner, e.status, e.attempts, e.result_code, e.result, e.event_id, e.claimed_by, e.lease_until INTO r
          FROM onceflow.effects e
         WHERE e.owner = v_owner AND e.scope = effect_claim.scope AND e.idempotency_key = effect_claim.key
           FOR UPDATE;
        IF NOT FOUND AND v_owner <> '' THEN
            SELECT e.owner, e.status, e.attempts, e.result_code, e.result, e.event_id, e.claimed_by, e.lease_until INTO r
              FROM onceflow.effects e
             WHERE e.owner = '' AND e.scope = effect_claim.scope AND e.idempotency_key = effect_claim.key
               FOR UPDATE;
        END IF;
        v_new := NOT FOUND;
        -- A claimant of the lease protocol (effect_lease_claim: the
        -- Python fence, effects.DoLeased, the http handler) makes its
        -- call holding no lock: while its lease runs, the key is busy.
        -- Answer 'busy' (nothing changed, the lock let go); the caller
        -- claims again later (effects.Do waits).
        IF NOT v_new AND r.status = 'intent' AND r.claimed_by IS NOT NULL AND r.lease_until > now() THEN
            PERFORM pg_advisory_unlock(3839, v_lock);
            v := ROW('busy', r.attempts, NULL, NULL);
            RETURN v;
        END IF;
        IF v_new THEN
            PERFORM onceflow.effect_new_key_check('effect_claim');
            INSERT INTO onceflow.effects (scope, idempotency_key, event_id, status, attempts, owner)
            VALUES (effect_claim.scope, effect_claim.key, effect_claim.event_id, 'intent', 1, onceflow.effect_insert_owner(effect_claim.scope));
            v := ROW('intent', 1, NULL, NULL);
        ELSIF r.status = 'intent' OR (r.event_id IS NULL AND effect_claim.event_id IS NOT NULL) THEN
            UPDATE onceflow.effects AS e
               SET attempts = e.attempts + CASE WHEN e.status = 'intent' THEN 1 ELSE 0 END,
                   event_id = COALESCE(e.event_id, effect_claim.event_id)
             WHERE e.owner = r.owner AND e.scope = effect_claim.scope AND e.idempotency_key = effect_claim.key
            RETURNING e.status, e.attempts, e.result_code, e.result
                 INTO v.status, v.attempts, v.result_code, v.result;
        ELSE
            v := ROW(r.status, r.attempts, r.result_code, r.result);
        END IF;
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

-- effect_lease_claim (migrations 022, 025).
CREATE OR REPLACE FUNCTION onceflow.effect_lease_claim(key text, scope text, event_id text, owner text, lease interval)
RETURNS onceflow.effect_lease_state
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_err   text := onceflow.effect_key_error(effect_lease_claim.key);
    v_lock  integer;
    v_owner text;
    r       record;
    v       onceflow.effect_lease_state;
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
    v_lock := onceflow.effect_lock_id(effect_lease_claim.scope, effect_lease_claim.key);
    v_owner := onceflow.effect_owner(effect_lease_claim.scope);
    -- A caller of the session-lock protocol (effect_claim) is in its call.
    IF NOT pg_try_advisory_xact_lock(3839, v_lock) THEN
        SELECT 'busy', e.attempts, NULL, NULL, e.claimed_by, now() + interval '1 second'
          INTO v FROM onceflow.effects e
         WHERE e.owner = onceflow.effect_row_owner(effect_lease_claim.scope, effect_lease_claim.key)
           AND e.scope = effect_lease_claim.scope AND e.idempotency_key = effect_lease_claim.key;
        v.status := 'busy';
        v.lease_until := now() + interval '1 second';
        RETURN v;
    END IF;
    -- The key's inserters one at a time; then its row, wherever it lies.
    PERFORM pg_advisory_xact_lock(x'0e1e'::integer, v_lock);
    SELECT e.owner, e.status, e.attempts, e.result_code, e.result, e.claimed_by, e.lease_until INTO r
      FROM onceflow.effects e
     WHERE e.owner = v_owner AND e.scope = effect_lease_claim.scope AND e.idempotency_key = effect_lease_claim.key
       FOR UPDATE;
    IF NOT FOUND AND v_owner <> '' THEN
        SELECT e.owner, e.status, e.attempts, e.result_code, e.result, e.claimed_by, e.lease_until INTO r
          FROM onceflow.effects e
         WHERE e.owner = '' AND e.scope = effect_lease_claim.scope AND e.idempotency_key = effect_lease_claim.key
           FOR UPDATE;
    END IF;
    IF NOT FOUND THEN
        PERFORM onceflow.effect_new_key_check('effect_lease_claim');
        INSERT INTO onceflow.effects AS e (scope, idempotency_key, event_id, status, attempts, claimed_by, lease_until, owner)
        VALUES (effect_lease_claim.scope, effect_lease_claim.key, effect_lease_claim.event_id, 'intent', 1,
                effect_lease_claim.owner, now() + effect_lease_claim.lease, onceflow.effect_insert_owner(effect_lease_claim.scope))
        RETURNING 'claimed', e.attempts, e.result_code, e.result, e.claimed_by, e.lease_until INTO v;
        RETURN v;
    END IF;
    IF r.status = 'intent'
       AND (r.claimed_by IS NULL OR r.claimed_by = effect_lease_claim.owner OR r.lease_until IS NULL OR r.lease_until <= now()) THEN
        UPDATE onceflow.effects AS e
           SET attempts = e.attempts + 1,
               claimed_by = effect_lease_claim.owner,
               lease_until = now() + effect_lease_claim.lease,
               event_id = COALESCE(e.event_id, effect_lease_claim.event_id)
         WHERE e.owner = r.owner AND e.scope = effect_lease_claim.scope AND e.idempotency_key = effect_lease_claim.key
        RETURNING 'claimed', e.attempts, e.result_code, e.result, e.claimed_by, e.lease_until INTO v;
        RETURN v;
    END IF;
    -- Done, held, or claimed by another owner whose lease runs (the row
    -- is locked by the probe above: this answer is current).
    v := ROW(CASE WHEN r.status IN ('done', 'held') THEN r.status ELSE 'busy' END, r.attempts, r.result_code, r.result, r.claimed_by, r.lease_until);
    IF v.status = 'held' THEN
        RAISE EXCEPTION 'onceflow: effect % in scope % is held for an operator (its retry came after the downstream''s idempotency window); resolve it with onceflow.effect_resolve or let it send with onceflow.effect_unhold',
            quote_literal(effect_lease_claim.key), quote_literal(effect_lease_claim.scope)
            USING ERRCODE = 'OFH01';
    END IF;
    RETURN v;
END
$fn$;

-- effect_lease_record (migration 022).
CREATE OR REPLACE FUNCTION onceflow.effect_lease_record(key text, scope text, result_code integer, result jsonb, event_id text DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_err    text := onceflow.effect_key_error(effect_lease_record.key);
    v_owner  text;
    v_row_owner text;
    v_status text;
BEGIN
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: %', v_err USING ERRCODE = '22023';
    END IF;
    IF effect_lease_record.scope IS NULL THEN
        RAISE EXCEPTION 'onceflow.effect_lease_record: scope is NULL (use '''' for none)' USING ERRCODE = '22023';
    END IF;
    v_owner := onceflow.effect_owner(effect_lease_record.scope);
    PERFORM pg_advisory_xact_lock(x'0e1e'::integer, onceflow.effect_lock_id(effect_lease_record.scope, effect_lease_record.key));
    SELECT e.owner, e.status INTO v_row_owner, v_status FROM onceflow.effects e
     WHERE e.owner = v_owner AND e.scope = effect_lease_record.scope AND e.idempotency_key = effect_lease_record.key
       FOR UPDATE;
    IF NOT FOUND AND v_owner <> '' THEN
        SELECT e.owner, e.status INTO v_row_owner, v_status FROM onceflow.effects e
         WHERE e.owner = '' AND e.scope = effect_lease_record.scope AND e.idempotency_key = effect_lease_record.key
           FOR UPDATE;
    END IF;
    IF NOT FOUND THEN
        PERFORM onceflow.effect_new_key_check('effect_lease_record');
        INSERT INTO onceflow.effects (scope, idempotency_key, event_id, status, attempts, result_code, result, completed_at, owner)
        VALUES (effect_lease_record.scope, effect_lease_record.key, effect_lease_record.event_id, 'done', 1,
                effect_lease_record.result_code, effect_lease_record.result, now(), onceflow.effect_insert_owner(effect_lease_record.scope));
        RETURN true;
    END IF;
    IF v_status <> 'intent' THEN
        RETURN false;
    END IF;
    UPDATE onceflow.effects AS e
       SET status = 'done', result_code = effect_lease_record.result_code, result = effect_lease_record.result,
           completed_at = now(), claimed_by = NULL, lease_until = NULL,
           event_id = COALESCE(e.event_id, effect_lease_record.event_id)
     WHERE e.owner = v_row_owner AND e.scope = effect_lease_record.scope AND e.idempotency_key = effect_lease_record.key;
    RETURN true;
END
$fn$;

-- effect_lease_claim_many (migration 026): still set-based, one
-- statement per owner of the group's keys (one, as a rule).
CREATE OR REPLACE FUNCTION onceflow.effect_lease_claim_many(keys text[], scopes text[], event_ids text[], owners text[], leases interval[])
RETURNS TABLE (i integer, status text, attempts integer, result_code integer, result jsonb, claimed_by text, lease_until timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $fn$
#variable_conflict use_column
DECLARE
    n        integer := coalesce(cardinality(keys), 0);
    r        record;
    v_free   boolean[];
    v_scopes text[] := '{}';
    v_keys   text[] := '{}';
    v_owner  text;
    v_owners text[];
    v_ins    text;
    v_s      text[];
    v_k      text[];
    v_new    integer;
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
    -- Each claim's owner, once (effect_owner is not inlined).
    v_owners := ARRAY(SELECT onceflow.effect_owner(u.scope) FROM unnest(scopes) WITH ORDINALITY AS u(scope, ord) ORDER BY u.ord);
    -- The inserters' locks of the free keys, in one order (lock id), so
    -- that two groups with keys in common cannot deadlock on them.
    PERFORM pg_advisory_xact_lock(x'0e1e'::integer, s.h)
       FROM (SELECT DISTINCT onceflow.effect_lock_id(u.scope, u.key) AS h
               FROM unnest(keys, scopes) WITH ORDINALITY AS u(key, scope, ord)
              WHERE v_free[u.ord] ORDER BY 1 OFFSET 0) s;
    -- The claims, per owner (the probe's partitions pruned by it): new
    -- keys, intents nobody holds, this owner's own, and those whose
    -- lease has expired (effect_lease_claim's rules).
    FOR v_owner IN SELECT DISTINCT o FROM unnest(v_owners) AS o LOOP
        -- The owner new rows get (effect_owner of an owner is itself).
        v_ins := onceflow.effect_insert_owner(v_owner);
        -- The existing rows of the group's keys, locked in (scope, key)
        -- order: the answers read below are current.
        PERFORM 1 FROM onceflow.effects e
          JOIN (SELECT DISTINCT u.scope, u.key FROM unnest(keys, scopes) WITH ORDINALITY AS u(key, scope, ord)
                 WHERE v_free[u.ord] AND v_owners[u.ord] = v_owner) q
            ON e.owner = v_owner AND e.scope = q.scope AND e.idempotency_key = q.key
         ORDER BY e.scope, e.idempotency_key
           FOR UPDATE OF e;
        IF v_owner <> '' THEN
            PERFORM 1 FROM onceflow.effects e
              JOIN (SELECT DISTINCT u.scope, u.key FROM unnest(keys, scopes) WITH ORDINALITY AS u(key, scope, ord)
                     WHERE v_free[u.ord] AND v_owners[u.ord] = v_owner) q
                ON e.owner = '' AND e.scope = q.scope AND e.idempotency_key = q.key
             ORDER BY e.scope, e.idempotency_key
               FOR UPDATE OF e;
        END IF;
        WITH req AS (
            SELECT DISTINCT ON (u.scope, u.key) u.key, u.scope, u.event_id, u.owner, u.lease
              FROM unnest(keys, scopes, event_ids, owners, leases) WITH ORDINALITY AS u(key, scope, event_id, owner, lease, ord)
             WHERE v_free[u.ord] AND v_owners[u.ord] = v_owner
             ORDER BY u.scope, u.key, u.ord
        ), upd AS (
            UPDATE onceflow.effects AS e
               SET attempts = e.attempts + 1,
                   claimed_by = q.owner,
                   lease_until = now() + q.lease,
                   event_id = COALESCE(e.event_id, q.event_id)
              FROM req q
             WHERE e.owner IN (v_owner, '') AND e.scope = q.scope AND e.idempotency_key = q.key
               AND e.status = 'intent'
               AND (e.claimed_by IS NULL OR e.claimed_by = q.owner OR e.lease_until IS NULL OR e.lease_until <= now())
            RETURNING e.scope, e.idempotency_key
        ), ins AS (
            INSERT INTO onceflow.effects (scope, idempotency_key, event_id, status, attempts, claimed_by, lease_until, owner)
            SELECT q.scope, q.key, q.event_id, 'intent', 1, q.owner, now() + q.lease, v_ins FROM req q
             WHERE NOT EXISTS (SELECT 1 FROM onceflow.effects e
                                WHERE e.owner = v_owner AND e.scope = q.scope AND e.idempotency_key = q.key)
               AND NOT EXISTS (SELECT 1 FROM onceflow.effects e
                                WHERE e.owner = '' AND e.scope = q.scope AND e.idempotency_key = q.key)
             ORDER BY q.scope, q.key
            RETURNING scope, idempotency_key
        ), claimed AS (
            SELECT u.scope, u.idempotency_key, false AS new FROM upd u
            UNION ALL
            SELECT n.scope, n.idempotency_key, true FROM ins n
        )
        SELECT array_agg(c.scope), array_agg(c.idempotency_key), count(*) FILTER (WHERE c.new) INTO v_s, v_k, v_new FROM claimed c;
        IF v_new > 0 THEN
            PERFORM onceflow.effect_new_key_check('effect_lease_claim_many');
        END IF;
        v_scopes := v_scopes || coalesce(v_s, '{}');
        v_keys := v_keys || coalesce(v_k, '{}');
    END LOOP;
    -- The answers, read after the claims (a new snapshot: the rows the
    -- claims did not take were locked above, so this read is current).
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
      LEFT JOIN LATERAL (SELECT x.status, x.attempts, x.result_code, x.result, x.claimed_by, x.lease_until
                           FROM onceflow.effects x
                          WHERE x.owner = v_owners[u.ord] AND x.scope = u.scope AND x.idempotency_key = u.key
                         UNION ALL
                         SELECT x.status, x.attempts, x.result_code, x.result, x.claimed_by, x.lease_until
                           FROM onceflow.effects x
                          WHERE x.owner = '' AND x.scope = u.scope AND x.idempotency_key = u.key
                          LIMIT 1) e ON true
      LEFT JOIN (SELECT DISTINCT x.scope, x.key FROM unnest(v_scopes, v_keys) AS x(scope, key)) c
             ON c.scope = u.scope AND c.key = u.key
     ORDER BY u.ord;
END
$fn$;

-- The functions that read or change a key's row find it among its owner's
-- partitions and the legacy one (partition-pruned by owner), as the probe
-- does. Their behaviour is unchanged.
CREATE OR REPLACE FUNCTION onceflow.effect_record(key text, scope text DEFAULT '', result_code integer DEFAULT NULL, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
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
     WHERE e.owner = onceflow.effect_row_owner(effect_record.scope, effect_record.key)
       AND e.scope = effect_record.scope AND e.idempotency_key = effect_record.key AND e.status = 'intent';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'onceflow.effect_record: no intent for key % in scope %', quote_literal(effect_record.key), quote_literal(effect_record.scope)
            USING ERRCODE = '55000';
    END IF;
    PERFORM pg_advisory_unlock(3839, onceflow.effect_lock_id(effect_record.scope, effect_record.key));
END
$fn$;

CREATE OR REPLACE FUNCTION onceflow.effect_lease_release(key text, scope text, owner text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $fn$
#variable_conflict use_column
BEGIN
    UPDATE onceflow.effects AS e
       SET claimed_by = NULL, lease_until = NULL
     WHERE e.owner = onceflow.effect_row_owner(effect_lease_release.scope, effect_lease_release.key)
       AND e.scope = effect_lease_release.scope AND e.idempotency_key = effect_lease_release.key
       AND e.status = 'intent' AND e.claimed_by = effect_lease_release.owner;
    RETURN FOUND;
END
$fn$;

CREATE OR REPLACE FUNCTION onceflow.effect_window_age(key text, scope text)
RETURNS interval
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $fn$
    SELECT now() - COALESCE(e.unheld_at, e.created_at)
      FROM onceflow.effects e
     WHERE e.owner = onceflow.effect_row_owner(effect_window_age.scope, effect_window_age.key)
       AND e.scope = effect_window_age.scope AND e.idempotency_key = effect_window_age.key
$fn$;

CREATE OR REPLACE FUNCTION onceflow.effect_hold(key text, scope text, reason text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
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
     WHERE e.owner = onceflow.effect_row_owner(effect_hold.scope, effect_hold.key)
       AND e.scope = effect_hold.scope AND e.idempotency_key = effect_hold.key AND e.status = 'intent';
    v_found := FOUND;
    IF onceflow.effect_held(effect_hold.scope, effect_hold.key) THEN
        PERFORM pg_advisory_unlock(3839, onceflow.effect_lock_id(effect_hold.scope, effect_hold.key));
    END IF;
    RETURN v_found;
END
$fn$;

CREATE OR REPLACE FUNCTION onceflow.effect_resolve(key text, scope text, result_code integer DEFAULT NULL, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_status text;
BEGIN
    UPDATE onceflow.effects AS e
       SET status = 'done', result_code = effect_resolve.result_code, result = effect_resolve.result, completed_at = now()
     WHERE e.owner = onceflow.effect_row_owner(effect_resolve.scope, effect_resolve.key)
       AND e.scope = effect_resolve.scope AND e.idempotency_key = effect_resolve.key AND e.status = 'held';
    IF NOT FOUND THEN
        SELECT e.status INTO v_status FROM onceflow.effects e
         WHERE e.owner = onceflow.effect_row_owner(effect_resolve.scope, effect_resolve.key)
           AND e.scope = effect_resolve.scope AND e.idempotency_key = effect_resolve.key;
        RAISE EXCEPTION 'onceflow.effect_resolve: effect % in scope % is not held (%)', quote_literal(effect_resolve.key),
            quote_literal(effect_resolve.scope), COALESCE('status ' || v_status, 'no such effect')
            USING ERRCODE = '55000';
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION onceflow.effect_unhold(key text, scope text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $fn$
#variable_conflict use_column
DECLARE
    v_status text;
BEGIN
    UPDATE onceflow.effects AS e
       SET status = 'intent', unheld_at = now()
     WHERE e.owner = onceflow.effect_row_owner(effect_unhold.scope, effect_unhold.key)
       AND e.scope = effect_unhold.scope AND e.idempotency_key = effect_unhold.key AND e.status = 'held';
    IF NOT FOUND THEN
        SELECT e.status INTO v_status FROM onceflow.effects e
         WHERE e.owner = onceflow.effect_row_owner(effect_unhold.scope, effect_unhold.key)
           AND e.scope = effect_unhold.scope AND e.idempotency_key = effect_unhold.key;
        RAISE EXCEPTION 'onceflow.effect_unhold: effect % in scope % is not held (%)', quote_literal(effect_unhold.key),
            quote_literal(effect_unhold.scope), COALESCE('status ' || v_status, 'no such effect')
            USING ERRCODE = '55000';
    END IF;
END
$fn$;

DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.effects'::regclass) = 'r' THEN
        ALTER TABLE onceflow.effects VALIDATE CONSTRAINT effects_legacy_owner;
    END IF;
END $$;

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS effects_legacy_key ON onceflow.effects (owner, scope, idempotency_key, created_at);

-- The time-bucket partitions of each consumer owner.
CREATE TABLE IF NOT EXISTS onceflow.effects_buckets (
    owner        text        NOT NULL,
    from_at      timestamptz NOT NULL,
    to_at        timestamptz NOT NULL,
    relname      name        NOT NULL UNIQUE,
    -- When effects_keep_bucket_rows last moved the rows to keep out.
    kept_at      timestamptz,
    truncated_at timestamptz,
    PRIMARY KEY (owner, from_at)
);

-- The width of an owner's buckets for a longest TTL of p_keep_s seconds:
-- an eighth of it in whole hours, at least one hour (about nine buckets
-- live per owner; a done effect is kept at most two widths longer than the
-- TTL).
CREATE OR REPLACE FUNCTION onceflow.effects_bucket_width(p_keep_s bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT greatest(3600, ceil(p_keep_s::numeric / 8 / 3600)::bigint * 3600)
$fn$;

-- Creates the partitions of owner p_owner's bucket holding p_at and of the
-- next one when missing, and returns the end of p_at's bucket. The width
-- is the owner's existing buckets' (a change of the policy never makes two
-- buckets overlap), else effects_bucket_width(p_keep_s). A bucket whose
-- range the default partition already has rows of is not made (they stay
-- there, pruned row by row); the next one is. Attaching a
-- partition takes SHARE UPDATE EXCLUSIVE on onceflow.effects and ACCESS
-- EXCLUSIVE on the default partition (which every probe of a key reads),
-- each waited for at most 100 ms: the caller tries again at its next pass
-- (the next bucket is made a whole bucket ahead).
CREATE OR REPLACE FUNCTION onceflow.effects_ensure_buckets(p_owner text, p_keep_s bigint, p_at timestamptz DEFAULT now())
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $fn$
DECLARE
    v_w    bigint;
    v_from timestamptz;
    v_to   timestamptz;
    v_name text;
    v_end  timestamptz;
    i      integer;
BEGIN
    IF p_owner IS NULL OR p_owner !~ '^inbox/[^/]*/$' THEN
        RAISE EXCEPTION 'onceflow.effects_ensure_buckets: % is not a consumer''s owner (inbox/<consumer>/)', quote_nullable(p_owner) USING ERRCODE = '22023';
    END IF;
    IF p_keep_s IS NULL OR p_keep_s <= 0 THEN
        RAISE EXCEPTION 'onceflow.effects_ensure_buckets: keep must be positive seconds, got %', p_keep_s USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(x'0e1d'::integer, hashtext(p_owner));
    SELECT extract(epoch FROM b.to_at - b.from_at)::bigint INTO v_w FROM onceflow.effects_buckets b
     WHERE b.owner = p_owner ORDER BY b.from_at DESC LIMIT 1;
    v_w := coalesce(v_w, onceflow.effects_bucket_width(p_keep_s));
    FOR i IN 0..1 LOOP
        v_from := to_timestamp((floor(extract(epoch FROM p_at) / v_w) + i) * v_w);
        v_to := v_from + make_interval(secs => v_w);
        IF i = 0 THEN
            v_end := v_to;
        END IF;
        CONTINUE WHEN EXISTS (SELECT 1 FROM onceflow.effects_buckets b WHERE b.owner = p_owner AND b.from_at = v_from);
        v_name := 'effects_b_' || left(md5(p_owner || E'\n' || v_from::text), 20);
        BEGIN
            EXECUTE format('CREATE TABLE onceflow.%I (LIKE onceflow.effects INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', v_name);
            EXECUTE format('ALTER TABLE onceflow.effects ATTACH PARTITION onceflow.%I FOR VALUES FROM (%L, %L) TO (%L, %L)',
                           v_name, p_owner, v_from, p_owner, v_to);
        EXCEPTION WHEN check_violation THEN
            -- The default partition holds rows of this range (they came
            -- before the bucket): the next bucket is still made, so that
            -- the owner's rows leave the default partition from then on.
            CONTINUE;
        END;
        INSERT INTO onceflow.effects_buckets (owner, from_at, to_at, relname) VALUES (p_owner, v_from, v_to, v_name);
    END LOOP;
    RETURN v_end;
END
$fn$;

-- The inbox partitions of consumer p_consumer, as a condition on alias i:
-- each of its lanes with its name, constants the planner prunes every
-- other partition with.
CREATE OR REPLACE FUNCTION onceflow.effects_inbox_lanes(p_consumer text)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT string_agg(format('(i.lane = %L AND i.consumer = %L)', l.lane, p_consumer), ' OR ')
      FROM (SELECT 'legacy' UNION SELECT DISTINCT x.lane FROM onceflow.inbox_lanes x WHERE x.consumer = p_consumer) AS l(lane)
$fn$;

-- Retention's first step on an expired bucket of owner p_owner (consumer
-- p_consumer's scopes), without a lock on the bucket: the rows it must keep
-- move to the legacy partition (owner ''), where the probe of a key still
-- finds them. Kept: every row not done (intent, held), every row without an
-- event, and every done row whose event still has an inbox row of
-- p_consumer (a permanent class, a longer TTL, a parked, dead, held or late
-- row; the probe reads only the consumer's lanes' partitions, one index
-- descent each). The bucket is read once and each done row probes the
-- inbox: the long part, done here under row locks only (a claim of a key
-- being moved waits for it, then finds the row in the legacy partition).
CREATE OR REPLACE FUNCTION onceflow.effects_keep_bucket_rows(p_owner text, p_consumer text, p_from timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_name  name;
    v_moved bigint;
BEGIN
    SELECT b.relname INTO v_name FROM onceflow.effects_buckets b
     WHERE b.owner = p_owner AND b.from_at = p_from AND b.truncated_at IS NULL;
    IF v_name IS NULL THEN
        RAISE EXCEPTION 'onceflow.effects_keep_bucket_rows: no bucket % % to expire', p_owner, p_from USING ERRCODE = '22023';
    END IF;
    EXECUTE format($q$
        WITH moved AS (
            DELETE FROM onceflow.%I e
             WHERE e.status <> 'done' OR e.event_id IS NULL
                OR EXISTS (SELECT 1 FROM onceflow.inbox i WHERE (%s) AND i.event_id = e.event_id)
            RETURNING e.idempotency_key, e.event_id, e.status, e.attempts, e.result_code, e.result, e.created_at, e.completed_at,
                e.scope, e.claimed_by, e.lease_until, e.held_at, e.held_reason, e.unheld_at
        )
        INSERT INTO onceflow.effects_legacy (idempotency_key, event_id, status, attempts, result_code, result, created_at, completed_at,
            scope, claimed_by, lease_until, held_at, held_reason, unheld_at, owner)
        SELECT m.idempotency_key, m.event_id, m.status, m.attempts, m.result_code, m.result, m.created_at, m.completed_at,
            m.scope, m.claimed_by, m.lease_until, m.held_at, m.held_reason, m.unheld_at, ''
          FROM moved m$q$, v_name, onceflow.effects_inbox_lanes(p_consumer));
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    UPDATE onceflow.effects_buckets SET kept_at = now() WHERE owner = p_owner AND from_at = p_from;
    RETURN v_moved;
END
$fn$;

-- Retention's second step: the bucket is locked (ACCESS EXCLUSIVE on it
-- only, waited for at most 100 ms: the caller retries) and truncated,
-- after the rows to keep that the first step could not see moved out too:
-- rows not done or without an event, and done rows completed since an
-- hour before the first step whose event has an inbox row (a row made done
-- by a transaction that committed its inbox row after the first step read
-- it; a transaction open longer than that hour is not covered). Without a
-- first step, every done row probes the inbox here, under the lock.
CREATE OR REPLACE FUNCTION onceflow.effects_expire_bucket(p_owner text, p_consumer text, p_from timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $fn$
DECLARE
    v_name  name;
    v_kept  timestamptz;
    v_moved bigint;
BEGIN
    SELECT b.relname, b.kept_at INTO v_name, v_kept FROM onceflow.effects_buckets b WHERE b.owner = p_owner AND b.from_at = p_from;
    IF v_name IS NULL THEN
        RAISE EXCEPTION 'onceflow.effects_expire_bucket: no bucket % %', p_owner, p_from USING ERRCODE = '22023';
    END IF;
    EXECUTE format('LOCK TABLE onceflow.%I IN ACCESS EXCLUSIVE MODE', v_name);
    EXECUTE format($q$
        INSERT INTO onceflow.effects_legacy (idempotency_key, event_id, status, attempts, result_code, result, created_at, completed_at,
            scope, claimed_by, lease_until, held_at, held_reason, unheld_at, owner)
        SELECT e.idempotency_key, e.event_id, e.status, e.attempts, e.result_code, e.result, e.created_at, e.completed_at,
            e.scope, e.claimed_by, e.lease_until, e.held_at, e.held_reason, e.unheld_at, ''
          FROM onceflow.%I e
         WHERE e.status <> 'done' OR e.event_id IS NULL
            OR ((%L::timestamptz IS NULL OR e.completed_at >= %L::timestamptz - interval '1 hour')
                AND EXISTS (SELECT 1 FROM onceflow.inbox i WHERE (%s) AND i.event_id = e.event_id))$q$,
        v_name, v_kept, v_kept, onceflow.effects_inbox_lanes(p_consumer));
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    EXECUTE format('TRUNCATE onceflow.%I', v_name);
    UPDATE onceflow.effects_buckets SET truncated_at = now() WHERE owner = p_owner AND from_at = p_from;
    RETURN v_moved;
END
$fn$;

-- Retention's second step: the truncated bucket's partition is dropped
-- (ACCESS EXCLUSIVE on onceflow.effects, waited for at most 100 ms; the
-- caller retries, and a bucket left truncated is dropped by a later pass).
CREATE OR REPLACE FUNCTION onceflow.effects_drop_bucket(p_owner text, p_from timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $fn$
DECLARE
    v_name name;
    v_rows boolean;
BEGIN
    SELECT b.relname INTO v_name FROM onceflow.effects_buckets b
     WHERE b.owner = p_owner AND b.from_at = p_from AND b.truncated_at IS NOT NULL;
    IF v_name IS NULL THEN
        RAISE EXCEPTION 'onceflow.effects_drop_bucket: no truncated bucket % %', p_owner, p_from USING ERRCODE = '22023';
    END IF;
    LOCK TABLE onceflow.effects IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM onceflow.%I)', v_name) INTO v_rows;
    IF v_rows THEN
        RAISE EXCEPTION 'onceflow.effects_drop_bucket: bucket % has rows again', v_name USING ERRCODE = '55000';
    END IF;
    EXECUTE format('DROP TABLE onceflow.%I', v_name);
    DELETE FROM onceflow.effects_buckets WHERE owner = p_owner AND from_at = p_from;
END
$fn$;

-- The consumer's role runs these with the owner's rights (deploy/sql/roles.sql).
REVOKE ALL ON FUNCTION onceflow.effects_ensure_buckets(text, bigint, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.effects_keep_bucket_rows(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.effects_expire_bucket(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.effects_drop_bucket(text, timestamptz) FROM PUBLIC;

-- Last, the swap: one transaction; a failure leaves the plain table, and
-- the file can be run again from the start.
DO $$
DECLARE
    r record;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.effects'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    -- The concurrently built index becomes a constraint, which the parent's
    -- unique constraint takes as the partition's (else ATTACH builds one).
    ALTER TABLE onceflow.effects ADD CONSTRAINT effects_legacy_key UNIQUE USING INDEX effects_legacy_key;
    ALTER TABLE onceflow.effects RENAME TO effects_legacy;
    ALTER TABLE onceflow.effects_legacy RENAME CONSTRAINT effects_pkey TO effects_legacy_pkey;
    ALTER INDEX onceflow.effects_created_at RENAME TO effects_legacy_created_at;
    ALTER INDEX onceflow.effects_event_id RENAME TO effects_legacy_event_id;
    ALTER INDEX onceflow.effects_held RENAME TO effects_legacy_held;

    CREATE TABLE onceflow.effects (
        idempotency_key text        NOT NULL,
        event_id        text,
        status          text        NOT NULL DEFAULT 'intent',
        attempts        integer     NOT NULL DEFAULT 0,
        result_code     integer,
        result          jsonb,
        created_at      timestamptz NOT NULL DEFAULT now(),
        completed_at    timestamptz,
        scope           text        NOT NULL DEFAULT '',
        claimed_by      text,
        lease_until     timestamptz,
        held_at         timestamptz,
        held_reason     text,
        unheld_at       timestamptz,
        -- A row written without an owner (an operator's insert, a test)
        -- lands in the legacy partition, which is pruned row by row.
        owner           text        NOT NULL DEFAULT '',
        CONSTRAINT effects_status CHECK (status IN ('intent', 'done', 'held')),
        CONSTRAINT effects_scope_length CHECK (octet_length(scope) <= 512),
        CONSTRAINT effects_claimed_by_length CHECK (octet_length(claimed_by) <= 512),
        CONSTRAINT effects_held_reason_length CHECK (octet_length(held_reason) <= 2048),
        -- Not a primary key: the legacy partition keeps its own,
        -- (scope, idempotency_key). The probe of a key descends this
        -- index once per partition of its owner.
        CONSTRAINT effects_key UNIQUE (owner, scope, idempotency_key, created_at)
    ) PARTITION BY RANGE (owner, created_at);
    CREATE INDEX effects_created_at ON onceflow.effects (created_at);
    CREATE INDEX effects_event_id ON onceflow.effects (event_id, scope);
    CREATE INDEX effects_held ON onceflow.effects (scope, held_at) WHERE status = 'held';

    -- The old table's grants, table and column level, carry over.
    FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.effects_legacy'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT %s ON onceflow.effects TO %s', r.privilege_type, r.grantee::regrole);
    END LOOP;
    FOR r IN SELECT att.attname, a.grantee, a.privilege_type FROM pg_attribute att, aclexplode(att.attacl) a
              WHERE att.attrelid = 'onceflow.effects_legacy'::regclass AND att.attacl IS NOT NULL AND NOT att.attisdropped
                AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT %s (%I) ON onceflow.effects TO %s', r.privilege_type, r.attname, r.grantee::regrole);
    END LOOP;

    ALTER TABLE onceflow.effects ATTACH PARTITION onceflow.effects_legacy FOR VALUES FROM ('', MINVALUE) TO ('', MAXVALUE);

    -- Rows no bucket takes (a consumer whose pruner made no bucket yet, or
    -- not in time): pruned row by row.
    CREATE TABLE onceflow.effects_default PARTITION OF onceflow.effects DEFAULT;
    FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.effects_legacy'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
                AND a.privilege_type IN ('SELECT', 'DELETE')
    LOOP
        EXECUTE format('GRANT %s ON onceflow.effects_default TO %s', r.privilege_type, r.grantee::regrole);
    END LOOP;
    -- From now on a new row's owner is its scope's (the same transaction as
    -- the table: no row of a consumer's scope gets owner '' after it).
    CREATE OR REPLACE FUNCTION onceflow.effect_insert_owner(scope text)
    RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
        SELECT onceflow.effect_owner(scope)
    $fn$;
END $$;
