-- The database as a trust boundary (docs/security.md, "What the database
-- enforces"): what a producer login, the consumer's role or a planted object
-- can no longer do, whatever path it takes.
--
-- Locks: ADD CONSTRAINT … NOT VALID and CREATE TRIGGER take ACCESS EXCLUSIVE
-- (CREATE TRIGGER: SHARE ROW EXCLUSIVE) on onceflow.outbox for an instant;
-- VALIDATE CONSTRAINT on its own needs only SHARE UPDATE EXCLUSIVE, but a
-- migration is one transaction, so producers wait from the first ALTER
-- until the commit, i.e. through one scan of the outbox (published rows are
-- pruned, so it is usually small; the checks read sizes, not toasted
-- payloads). A constraint that rows already in the outbox break stays NOT
-- VALID, with a WARNING naming it: new rows are checked, old ones are the
-- relay's to set aside.

-- 1. Functions created from now on by the role that runs the migrations are
-- not executable by PUBLIC. Only global default privileges can take away
-- PUBLIC's EXECUTE (a per-schema entry can only add); they are per database
-- and per creating role. deploy/sql/roles.sql does the same FOR ROLE the
-- owner role.
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON ROUTINES FROM PUBLIC;

-- 2. Every function of the schema resolves names in pg_catalog only (and
-- refers to onceflow's objects by their qualified names), so an object
-- planted in a schema on the caller's search_path is never called. ALTER
-- FUNCTION composes with whatever body an earlier migration gave each one.
-- onceflow.source_shard is the one exception: a SET clause would stop the
-- planner from inlining it into the relay's fetch; its body is qualified
-- name by name instead (below).
DO $do$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
              WHERE p.pronamespace = 'onceflow'::regnamespace AND p.prokind = 'f'
                AND p.oid <> 'onceflow.source_shard(text, integer)'::regprocedure
                AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) AS c WHERE c LIKE 'search\_path=%')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, pg_temp', r.fn);
    END LOOP;
END
$do$;

CREATE OR REPLACE FUNCTION onceflow.source_shard(source text, shards integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT ((('x' OPERATOR(pg_catalog.||) pg_catalog.left(pg_catalog.md5(source), 8))::pg_catalog.bit(32)::pg_catalog.int8
             OPERATOR(pg_catalog.%) shards::pg_catalog.int8))::pg_catalog.int4
$fn$;

-- 3. Every row of the outbox is one that onceflow.enqueue would accept,
-- whatever inserted it (the Go API's INSERT, a hand-written INSERT, COPY).
-- The functions check first and keep their own messages; these are the
-- floor under every path. What a CHECK can say with built-in expressions is
-- a CHECK; the headers' entries, reserved topics and ownership need a
-- query, and are checked once per statement by outbox_guard (below), over
-- all the statement's rows at once: a CHECK calling a function would cost a
-- function call per row.
ALTER TABLE onceflow.outbox
    ADD CONSTRAINT outbox_payload_max CHECK (octet_length(payload) <= 1048576) NOT VALID,
    ADD CONSTRAINT outbox_topic_legal CHECK (octet_length(topic) <= 249 AND topic ~ '^[A-Za-z0-9._-]+$'
                                             AND topic <> '.' AND topic <> '..') NOT VALID,
    ADD CONSTRAINT outbox_source_max CHECK (octet_length(source) <= 512
                                            AND strpos(source, E'\n') = 0 AND strpos(source, E'\r') = 0) NOT VALID,
    ADD CONSTRAINT outbox_event_type_max CHECK (octet_length(event_type) <= 256
                                                AND strpos(event_type, E'\n') = 0 AND strpos(event_type, E'\r') = 0) NOT VALID,
    ADD CONSTRAINT outbox_event_id_max CHECK (octet_length(event_id) BETWEEN 1 AND 512
                                              AND strpos(event_id, E'\n') = 0 AND strpos(event_id, E'\r') = 0) NOT VALID,
    ADD CONSTRAINT outbox_content_type_max CHECK (octet_length(content_type) BETWEEN 1 AND 256
                                                  AND content_type !~ '[[:cntrl:]]') NOT VALID,
    ADD CONSTRAINT outbox_record_key_max CHECK (octet_length(record_key) <= 8192) NOT VALID,
    ADD CONSTRAINT outbox_headers_object CHECK (jsonb_typeof(headers) = 'object' AND pg_column_size(headers) <= 65536) NOT VALID;

DO $do$
DECLARE
    c text;
BEGIN
    FOREACH c IN ARRAY ARRAY['outbox_payload_max', 'outbox_topic_legal', 'outbox_source_max', 'outbox_event_type_max',
                             'outbox_event_id_max', 'outbox_content_type_max', 'outbox_record_key_max', 'outbox_headers_object',
                             'outbox_event_id_not_reserved'] LOOP
        BEGIN
            EXECUTE format('ALTER TABLE onceflow.outbox VALIDATE CONSTRAINT %I', c);
        EXCEPTION WHEN check_violation THEN
            RAISE WARNING 'onceflow.outbox: rows already in the outbox break constraint %; it stays NOT VALID (new rows are checked). Find them with: SELECT id FROM onceflow.outbox WHERE NOT (%)',
                c, (SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'onceflow.outbox'::regclass AND conname = c);
        END;
    END LOOP;
END
$do$;

-- 4. Topics no producer may write: the relay's checkpoint topic (a record
-- under a shard's key there would stop the shard), dead-letter topics, any
-- topic a component writes itself. The relay registers its checkpoint topic
-- at start (onceflow.reserve_topic, granted to the relay and consumer roles
-- by roles.sql); an operator may add others by hand.
CREATE TABLE onceflow.reserved_topics (
    topic       text        PRIMARY KEY,
    reserved_by text        NOT NULL,
    reserved_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT reserved_topics_topic_legal CHECK (octet_length(topic) <= 249 AND topic ~ '^[A-Za-z0-9._-]+$'
                                                  AND topic <> '.' AND topic <> '..'),
    CONSTRAINT reserved_topics_reserved_by CHECK (octet_length(reserved_by) BETWEEN 1 AND 200)
);

CREATE FUNCTION onceflow.reserve_topic(topic text, reserved_by text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    INSERT INTO onceflow.reserved_topics AS r (topic, reserved_by)
    VALUES (reserve_topic.topic, reserve_topic.reserved_by)
    ON CONFLICT ON CONSTRAINT reserved_topics_pkey DO NOTHING;
    RETURN FOUND;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.reserve_topic(text, text) FROM PUBLIC;

-- 5. Source ownership (optional): a login role with rows here (directly,
-- or through a role it is a member of) may enqueue only sources that start
-- with one of its prefixes, and supply only event ids that start with one
-- of them or are UUIDs (what the enqueue paths generate). A login with no
-- rows, and a superuser, is unrestricted, as before. The login is session_user: SET ROLE does
-- not change it. Rows are the owner's (or a superuser's) to write; no
-- application role may read or change them.
CREATE TABLE onceflow.source_owners (
    role          text NOT NULL,
    source_prefix text NOT NULL,
    PRIMARY KEY (role, source_prefix),
    CONSTRAINT source_owners_prefix CHECK (octet_length(source_prefix) BETWEEN 1 AND 512)
);

-- Why session_user may not enqueue source (with event id event_id), or
-- NULL when it may (migration 015 made it, answering NULL; the counters'
-- functions ask it before they lock).
CREATE OR REPLACE FUNCTION onceflow.source_refusal(source text, event_id text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    WITH mine AS (
        SELECT o.source_prefix FROM onceflow.source_owners o JOIN pg_roles r ON r.rolname = o.role
         WHERE pg_has_role(session_user, r.oid, 'MEMBER')
    )
    SELECT CASE
        -- A superuser is a member of every role, and could drop the guard.
        WHEN (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user) THEN NULL
        WHEN NOT EXISTS (SELECT 1 FROM mine) THEN NULL
        WHEN NOT EXISTS (SELECT 1 FROM mine WHERE starts_with(source_refusal.source, mine.source_prefix)) THEN
            format('source %s is not one of role %s''s (onceflow.source_owners)', quote_literal(left(source_refusal.source, 80)), session_user)
        WHEN source_refusal.event_id IS NOT NULL
         AND source_refusal.event_id !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[47][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
         AND NOT EXISTS (SELECT 1 FROM mine WHERE starts_with(source_refusal.event_id, mine.source_prefix)) THEN
            format('event_id %s is neither a UUID nor under one of role %s''s source prefixes (onceflow.source_owners)',
                   quote_literal(left(source_refusal.event_id, 80)), session_user)
    END
$fn$;
REVOKE ALL ON FUNCTION onceflow.source_refusal(text, text) FROM PUBLIC;

-- Why the rows a statement inserted into the outbox may not be stored, or
-- NULL: the first row (by id) that names a reserved topic, has a bad header
-- (not a string, an empty name, an envelope name, name plus value over 8
-- KiB, a traceparent that is not lower case or not W3C), or, with ownership
-- on, a source or event id the login does not own.
CREATE FUNCTION onceflow.outbox_guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_why text;
BEGIN
    SELECT format('topic %s is reserved (%s): no event may be enqueued to it', quote_literal(n.topic), r.reserved_by)
      INTO v_why
      FROM outbox_new n JOIN onceflow.reserved_topics r ON r.topic = n.topic
     ORDER BY n.id LIMIT 1;
    IF v_why IS NULL THEN
        SELECT format('event_id %s: headers: %s is reserved, empty, too long or not a string', quote_literal(n.event_id), quote_literal(e.k))
          INTO v_why
          FROM (SELECT * FROM outbox_new n
                 WHERE n.headers <> '{}'::jsonb
                   -- Most rows carry no header but the enqueue paths' own:
                   -- checked here without walking the object.
                   AND NOT (n.headers - ARRAY['traceparent', 'tracestate'] = '{}'::jsonb
                            AND (NOT n.headers ? 'traceparent'
                                 OR (jsonb_typeof(n.headers->'traceparent') = 'string'
                                     AND (n.headers->>'traceparent') ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[0-9a-zA-Z._-]*)?$'))
                            AND (NOT n.headers ? 'tracestate'
                                 OR (jsonb_typeof(n.headers->'tracestate') = 'string'
                                     AND octet_length(n.headers->>'tracestate') <= 8182)))
                OFFSET 0) n
               CROSS JOIN LATERAL jsonb_each(n.headers) AS e(k, v)
         WHERE (jsonb_typeof(e.v) <> 'string'
                OR e.k = ''
                OR lower(e.k) IN ('event-id', 'source', 'seq', 'event-type', 'content-type')
                OR octet_length(e.k) + octet_length(e.v #>> '{}') > 8192
                OR (lower(e.k) = 'traceparent'
                    AND (e.k <> 'traceparent'
                         OR (e.v #>> '{}') !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[0-9a-zA-Z._-]*)?$')))
         ORDER BY n.id LIMIT 1;
    END IF;
    IF v_why IS NULL AND EXISTS (SELECT 1 FROM onceflow.source_owners) THEN
        SELECT w.why INTO v_why
          FROM (SELECT n.id, onceflow.source_refusal(n.source, n.event_id) AS why FROM outbox_new n) w
         WHERE w.why IS NOT NULL
         ORDER BY w.id LIMIT 1;
    END IF;
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow.outbox: %', v_why USING ERRCODE = '42501';
    END IF;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_guard() FROM PUBLIC;
CREATE TRIGGER outbox_guard AFTER INSERT ON onceflow.outbox
    REFERENCING NEW TABLE AS outbox_new
    FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_guard();

-- Rows already in the outbox with bad headers: named, like a constraint
-- that stays NOT VALID.
DO $do$
DECLARE
    v_id bigint;
BEGIN
    SELECT o.id INTO v_id FROM onceflow.outbox o CROSS JOIN LATERAL jsonb_each(o.headers) AS e(k, v)
     WHERE o.headers <> '{}'::jsonb
       AND (jsonb_typeof(e.v) <> 'string' OR e.k = '' OR lower(e.k) IN ('event-id', 'source', 'seq', 'event-type', 'content-type')
            OR octet_length(e.k) + octet_length(e.v #>> '{}') > 8192)
     LIMIT 1;
    IF FOUND THEN
        RAISE WARNING 'onceflow.outbox: row % (and maybe others) already has a header that new rows may not have; the relay sets aside what Kafka refuses', v_id;
    END IF;
END
$do$;

-- The counter's guard: onceflow.enqueue, enqueue_batch and the Go API lock
-- a source's counter (INSERT … ON CONFLICT DO UPDATE) before they insert
-- the event; a BEFORE INSERT trigger fires before that lock is taken, so a
-- login cannot hold (or bump) the counter of a source it does not own. One
-- call per counter row: it is enabled only while onceflow.source_owners has
-- rows (source_owners_toggle), so that without ownership it costs nothing.
CREATE FUNCTION onceflow.source_seq_guard() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_why text := onceflow.source_refusal(NEW.source, NULL);
BEGIN
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow.source_seq: %', v_why USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.source_seq_guard() FROM PUBLIC;
CREATE TRIGGER source_seq_guard BEFORE INSERT ON onceflow.source_seq
    FOR EACH ROW EXECUTE FUNCTION onceflow.source_seq_guard();
ALTER TABLE onceflow.source_seq DISABLE TRIGGER source_seq_guard;

-- Ownership on while source_owners has rows, off when it has none. Only
-- the owner role (or a superuser) writes source_owners; the ALTER runs with
-- the function owner's rights and takes a brief ACCESS EXCLUSIVE lock on
-- onceflow.source_seq.
CREATE FUNCTION onceflow.source_owners_toggle() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_on      boolean := EXISTS (SELECT 1 FROM onceflow.source_owners);
    v_enabled boolean := (SELECT t.tgenabled <> 'D' FROM pg_trigger t
                           WHERE t.tgrelid = 'onceflow.source_seq'::regclass AND t.tgname = 'source_seq_guard');
BEGIN
    IF v_on AND NOT v_enabled THEN
        ALTER TABLE onceflow.source_seq ENABLE TRIGGER source_seq_guard;
    ELSIF NOT v_on AND v_enabled THEN
        ALTER TABLE onceflow.source_seq DISABLE TRIGGER source_seq_guard;
    END IF;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.source_owners_toggle() FROM PUBLIC;
CREATE TRIGGER source_owners_toggle AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON onceflow.source_owners
    FOR EACH STATEMENT EXECUTE FUNCTION onceflow.source_owners_toggle();

-- 6. The operator audit is append-only. created_at is the database's clock
-- at insert (whatever was supplied) and never changes, so that
-- prune_admin_audit's 30-day floor counts from the real insertion time. An
-- UPDATE may only finish a running change, once: outcome from 'running' to
-- another, result, and finished_at (the database's clock); nothing else
-- changes. DELETE only through prune_admin_audit. Roles that could disable
-- these triggers anyway (the table's owner, a superuser) are not held back:
-- a restore keeps its times, and prune_admin_audit runs as the owner.
CREATE FUNCTION onceflow.admin_audit_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_privileged boolean := pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE')
                            OR (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user);
BEGIN
    IF v_privileged THEN
        RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.created_at := now();
        NEW.finished_at := CASE WHEN NEW.outcome = 'running' THEN NULL ELSE now() END;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.outcome = 'running' AND NEW.outcome <> 'running'
       AND (NEW.id, NEW.request_id, NEW.consumer, NEW.action, NEW.actor, NEW.via, NEW.params, NEW.note, NEW.created_at)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.request_id, OLD.consumer, OLD.action, OLD.actor, OLD.via, OLD.params, OLD.note, OLD.created_at) THEN
        NEW.finished_at := now();
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'onceflow.admin_audit is append-only: % of audit row % refused (a running change may only be finished, once; rows are deleted only by onceflow.prune_admin_audit)',
        TG_OP, CASE TG_OP WHEN 'DELETE' THEN OLD.id ELSE NEW.id END
        USING ERRCODE = '42501';
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.admin_audit_guard() FROM PUBLIC;
CREATE TRIGGER admin_audit_guard BEFORE INSERT OR UPDATE OR DELETE ON onceflow.admin_audit
    FOR EACH ROW EXECUTE FUNCTION onceflow.admin_audit_guard();
