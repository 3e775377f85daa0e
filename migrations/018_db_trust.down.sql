DROP TRIGGER IF EXISTS admin_audit_guard ON onceflow.admin_audit;
DROP FUNCTION IF EXISTS onceflow.admin_audit_guard();
DROP TRIGGER IF EXISTS source_owners_toggle ON onceflow.source_owners;
DROP FUNCTION IF EXISTS onceflow.source_owners_toggle();
DROP TRIGGER IF EXISTS source_seq_guard ON onceflow.source_seq;
DROP FUNCTION IF EXISTS onceflow.source_seq_guard();
DROP TRIGGER IF EXISTS outbox_guard ON onceflow.outbox;
DROP FUNCTION IF EXISTS onceflow.outbox_guard();
-- Back to migration 015's answer: everyone may.
CREATE OR REPLACE FUNCTION onceflow.source_refusal(source text, event_id text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT NULL::text
$fn$;
DROP TABLE IF EXISTS onceflow.source_owners;
DROP FUNCTION IF EXISTS onceflow.reserve_topic(text, text);
DROP TABLE IF EXISTS onceflow.reserved_topics;
ALTER TABLE onceflow.outbox
    DROP CONSTRAINT IF EXISTS outbox_payload_max,
    DROP CONSTRAINT IF EXISTS outbox_topic_legal,
    DROP CONSTRAINT IF EXISTS outbox_source_max,
    DROP CONSTRAINT IF EXISTS outbox_event_type_max,
    DROP CONSTRAINT IF EXISTS outbox_event_id_max,
    DROP CONSTRAINT IF EXISTS outbox_content_type_max,
    DROP CONSTRAINT IF EXISTS outbox_record_key_max,
    DROP CONSTRAINT IF EXISTS outbox_headers_object;

CREATE OR REPLACE FUNCTION onceflow.source_shard(source text, shards integer)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT (('x' || left(md5(source), 8))::bit(32)::bigint % shards)::integer
$fn$;

-- The SECURITY INVOKER functions had no search_path of their own.
DO $do$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
              WHERE p.pronamespace = 'onceflow'::regnamespace AND p.prokind = 'f' AND NOT p.prosecdef
    LOOP
        EXECUTE format('ALTER FUNCTION %s RESET search_path', r.fn);
    END LOOP;
END
$do$;

ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON ROUTINES TO PUBLIC;
