-- The fencing protocol of onceflow.effects as SQL functions, so that a
-- program in any language gets what Go's effects.Do does (Do itself calls
-- them). See docs/agents.md, "The protocol in SQL (for any language)".
--
--   SELECT * FROM onceflow.effect_claim(key, scope, event_id);
--       status 'done'   → the recorded result; do not call. Nothing is held.
--       status 'intent' → the intent is recorded and this session holds the
--                         key: call the downstream with the key, then
--   SELECT onceflow.effect_record(key, scope, result_code, result);
--       → status done, and the key is released. After a failed call:
--   SELECT onceflow.effect_release(key, scope);
--       → the intent stays; the next claim calls again with the same key.
--
-- Claim on a connection of its own, in autocommit (or commit right after
-- it), never inside the business transaction: the intent must be committed
-- before the call, whatever becomes of that transaction. The key is held by
-- a session advisory lock, so the end of the session (a crash, a closed
-- connection) releases it too.

-- The ledger's scope column and primary key (scope, idempotency_key) come
-- from migration 006; the functions below rely on them.

-- Keys: the same rules as Go's effects.ValidateKey, EventKey and GraphKey
-- (pkg/effects/key.go); pkg/effects/testdata/keys.json holds the cases
-- Go, SQL and Python are all tested against. PostgreSQL text is valid UTF-8
-- (the database encoding) and cannot hold NUL, so those two rules hold by
-- construction here.

-- effect_key_error: NULL when key is a valid idempotency key, else why not.
CREATE FUNCTION onceflow.effect_key_error(key text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT CASE
        WHEN key IS NULL OR key = '' THEN 'empty'
        WHEN octet_length(key) > 600 THEN octet_length(key) || ' bytes, at most 600'
        WHEN key ~ '[\x01-\x1f\x7f]' THEN 'key contains a control character'
    END
$fn$;

-- The characters Go's strings.TrimSpace removes (Unicode White_Space).
CREATE FUNCTION onceflow.effect_blank(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT btrim(v, E' \t\n\x0b\f\r\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000') = ''
$fn$;

-- effect_part_error: NULL when v is a valid part of a graph key.
CREATE FUNCTION onceflow.effect_part_error(name text, v text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT CASE
        WHEN v IS NULL OR onceflow.effect_blank(v) THEN name || ' is empty'
        WHEN strpos(v, ':') > 0 THEN name || ' ' || quote_literal(v) || ' contains the separator '':'''
        WHEN octet_length(v) > 190 THEN name || ' is ' || octet_length(v) || ' bytes, at most 190'
        WHEN v ~ '[\x01-\x1f\x7f]' THEN name || ' contains a control character'
    END
$fn$;

-- effect_event_key: "event:<event id>", as effects.EventKey.
CREATE FUNCTION onceflow.effect_event_key(event_id text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
    v_key text := 'event:' || event_id;
    v_err text;
BEGIN
    IF event_id IS NULL OR onceflow.effect_blank(event_id) THEN
        v_err := 'event id is empty';
    ELSE
        v_err := onceflow.effect_key_error(v_key);
    END IF;
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: %', v_err USING ERRCODE = '22023';
    END IF;
    RETURN v_key;
END
$fn$;

-- effect_graph_key: "<thread_id>:<node>:<task_path>", as effects.GraphKey.
CREATE FUNCTION onceflow.effect_graph_key(thread_id text, node text, task_path text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
DECLARE
    v_err text := coalesce(onceflow.effect_part_error('thread id', thread_id),
                           onceflow.effect_part_error('node', node),
                           onceflow.effect_part_error('task path', task_path));
BEGIN
    IF v_err IS NULL AND thread_id = 'event' THEN
        v_err := 'thread id ''event'' is reserved for event keys';
    END IF;
    IF v_err IS NULL THEN
        v_err := onceflow.effect_key_error(thread_id || ':' || node || ':' || task_path);
    END IF;
    IF v_err IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow: invalid idempotency key: %', v_err USING ERRCODE = '22023';
    END IF;
    RETURN thread_id || ':' || node || ':' || task_path;
END
$fn$;

-- The lock that serialises the callers of one (scope, key): the two-int
-- session advisory lock (x'0eff', hashtext(scope || E'\n' || key)). Two-int
-- locks never collide with one-bigint ones; a hash collision only
-- serialises two unrelated keys.
CREATE FUNCTION onceflow.effect_lock_id(scope text, key text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT hashtext(scope || E'\n' || key)
$fn$;

-- effect_held: does this session hold the lock of (scope, key)?
CREATE FUNCTION onceflow.effect_held(scope text, key text) RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
           AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND l.classid = 3839 AND l.objsubid = 2
           AND l.objid = (onceflow.effect_lock_id(effect_held.scope, effect_held.key)::bigint & 4294967295)::oid)
$fn$;

CREATE TYPE onceflow.effect_state AS (
    status      text,     -- intent | done
    attempts    integer,
    result_code integer,
    result      jsonb
);

-- effect_claim: wait for the key, then record the intent (attempts + 1) or
-- find the recorded result. 'intent' → the session holds the key until
-- effect_record or effect_release (or its end); 'done' → nothing is held.
CREATE FUNCTION onceflow.effect_claim(key text, scope text DEFAULT '', event_id text DEFAULT NULL)
RETURNS onceflow.effect_state
LANGUAGE plpgsql VOLATILE AS $fn$
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

-- effect_record: the call succeeded; record its result (status done) and
-- release the key. Only the session that claimed the key may record it.
CREATE FUNCTION onceflow.effect_record(key text, scope text DEFAULT '', result_code integer DEFAULT NULL, result jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
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

-- effect_release: give the key up without a result (the call failed); the
-- intent stays. Returns whether this session held the key.
CREATE FUNCTION onceflow.effect_release(key text, scope text DEFAULT '')
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    IF effect_release.key IS NULL OR effect_release.scope IS NULL
       OR NOT onceflow.effect_held(effect_release.scope, effect_release.key) THEN
        RETURN false;
    END IF;
    RETURN pg_advisory_unlock(3839, onceflow.effect_lock_id(effect_release.scope, effect_release.key));
END
$fn$;
