-- onceflow least-privilege roles. See docs/security.md.
--
-- Creates (if missing) five NOLOGIN group roles and grants each exactly what
-- its component needs in the current database:
--
--   owner_role     owns schema onceflow and everything in it; runs the
--                  migrations (`relay migrate` / `consumer migrate`).
--   writer_role    producers: may only enqueue (onceflow.enqueue() or the Go
--                  API's INSERT into onceflow.outbox; the seq counters in
--                  onceflow.source_seq are written by the outbox's trigger,
--                  never by the producer). Cannot read payloads, mark,
--                  delete, choose a seq, touch the counters or consumer state.
--   relay_role     the relay: reads outbox rows, takes published ones off
--                  the queue (onceflow.outbox_pending) into the publish log
--                  (onceflow.outbox_published) and prunes them, holds onceflow.relay_lease, binds
--                  onceflow.database_identity, sets rows aside
--                  (onceflow.outbox_set_aside). Nothing of the inbox,
--                  seq state, gaps or effects; cannot create events.
--   consumer_role  the consumer: onceflow.inbox, consumer_offsets, seq_state,
--                  seq_gaps, effects; writes admin_audit (deletes only rows
--                  older than 30 days, through prune_admin_audit()) and
--                  may call relay_status() (counts, no payloads) and
--                  relay_set_aside() (set-aside rows, no payloads), as the
--                  relay role may too. Nothing of the outbox, unless
--                  consumer_may_enqueue is on (consume-transform-produce
--                  handlers that enqueue in the consumer's transaction): then
--                  it is also a member of writer_role, and nothing more.
--                  Its handlers' own tables are granted by you:
--                    GRANT SELECT, INSERT, UPDATE, DELETE ON app.my_table TO onceflow_consumer;
--   reader_role    `consumer reconcile` (docs/reliability.md): reads the
--                  identity, position and state columns reconcile needs
--                  (never a payload or a header) of the outbox, its queue,
--                  publish log and set-aside rows, the inbox, stored offsets
--                  and gaps; writes nothing but its run summaries
--                  (onceflow.reconcile_runs).
--
-- Login users are members of these roles, e.g.
--   CREATE ROLE relay_app LOGIN PASSWORD '…' IN ROLE onceflow_relay;
--
-- Usage, as a superuser, connected to the application's database:
--
--   psql "$ADMIN_URL" -X -v ON_ERROR_STOP=1 -f deploy/sql/roles.sql \
--        [-v owner_role=onceflow_owner] [-v writer_role=onceflow_writer] \
--        [-v relay_role=onceflow_relay] [-v consumer_role=onceflow_consumer] \
--        [-v reader_role=onceflow_reader] [-v consumer_may_enqueue=off]
--
-- The script is idempotent and must be run again after every migration
-- (grants are per table; a new table is reachable by its owner only until
-- then). Run it once before the first migration too: it creates schema
-- onceflow owned by owner_role and lets owner_role create it. Existing objects
-- in the schema (e.g. migrated earlier by a superuser) are handed to
-- owner_role. Privileges of the four other roles in the schema are revoked
-- and granted afresh on every run, so the result does not depend on history.
-- Roles are cluster-wide; the grants are per database.

\set ON_ERROR_STOP on
\if :{?owner_role}
\else
\set owner_role onceflow_owner
\endif
\if :{?writer_role}
\else
\set writer_role onceflow_writer
\endif
\if :{?relay_role}
\else
\set relay_role onceflow_relay
\endif
\if :{?consumer_role}
\else
\set consumer_role onceflow_consumer
\endif
\if :{?reader_role}
\else
\set reader_role onceflow_reader
\endif
\if :{?consumer_may_enqueue}
\else
\set consumer_may_enqueue off
\endif

BEGIN;

-- psql variables are not expanded inside the DO body: hand them over as
-- transaction-local settings.
SELECT set_config('onceflow_roles.owner', :'owner_role', true),
       set_config('onceflow_roles.writer', :'writer_role', true),
       set_config('onceflow_roles.relay', :'relay_role', true),
       set_config('onceflow_roles.consumer', :'consumer_role', true),
       set_config('onceflow_roles.reader', :'reader_role', true),
       set_config('onceflow_roles.consumer_may_enqueue', :'consumer_may_enqueue', true);

DO $roles$
DECLARE
    v_owner    text    := current_setting('onceflow_roles.owner');
    v_writer   text    := current_setting('onceflow_roles.writer');
    v_relay    text    := current_setting('onceflow_roles.relay');
    v_consumer text    := current_setting('onceflow_roles.consumer');
    v_reader   text    := current_setting('onceflow_roles.reader');
    v_enqueue  boolean := current_setting('onceflow_roles.consumer_may_enqueue')::boolean;
    v_apps     text;
    r          record;
BEGIN
    IF cardinality(ARRAY(SELECT DISTINCT x FROM unnest(ARRAY[v_owner, v_writer, v_relay, v_consumer, v_reader]) AS x)) <> 5 THEN
        RAISE EXCEPTION 'onceflow roles: owner_role, writer_role, relay_role, consumer_role and reader_role must be five different names';
    END IF;
    FOREACH v_apps IN ARRAY ARRAY[v_owner, v_writer, v_relay, v_consumer, v_reader] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_apps) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', v_apps);
        END IF;
        EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), v_apps);
    END LOOP;
    v_apps := format('%I, %I, %I, %I', v_writer, v_relay, v_consumer, v_reader);

    -- Owner: the schema and every object in it. The migrator runs
    -- CREATE SCHEMA IF NOT EXISTS, which needs CREATE on the database.
    EXECUTE format('GRANT CREATE ON DATABASE %I TO %I', current_database(), v_owner);
    IF to_regnamespace('onceflow') IS NULL THEN
        EXECUTE format('CREATE SCHEMA onceflow AUTHORIZATION %I', v_owner);
    ELSE
        EXECUTE format('ALTER SCHEMA onceflow OWNER TO %I', v_owner);
    END IF;
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
              WHERE c.relnamespace = 'onceflow'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
    LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO %I', r.rel, v_owner);  -- owned sequences follow
    END LOOP;
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
              WHERE c.relnamespace = 'onceflow'::regnamespace AND c.relkind = 'S'
                AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                                   AND d.objid = c.oid AND d.deptype IN ('a', 'i'))
    LOOP
        EXECUTE format('ALTER SEQUENCE %s OWNER TO %I', r.rel, v_owner);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p WHERE p.pronamespace = 'onceflow'::regnamespace LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO %I', r.fn, v_owner);
    END LOOP;

    -- Start from nothing: PUBLIC and the three roles lose everything in the
    -- schema (functions are executable by PUBLIC by default).
    EXECUTE format('REVOKE ALL ON SCHEMA onceflow FROM PUBLIC, %s', v_apps);
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA onceflow FROM PUBLIC, %s', v_apps);
    EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA onceflow FROM PUBLIC, %s', v_apps);
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA onceflow FROM PUBLIC, %s', v_apps);
    -- Functions the owner role creates later are not executable by PUBLIC
    -- either. Only a global entry can take PUBLIC's default EXECUTE away (a
    -- per-schema one can only add), so this covers the owner's functions in
    -- every schema of this database. Migration 018 does the same for the
    -- role that runs the migrations, when that is a login of its own.
    EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %I REVOKE EXECUTE ON ROUTINES FROM PUBLIC', v_owner);
    -- Column privileges are not covered by REVOKE ... ON ALL TABLES.
    FOR r IN SELECT DISTINCT c.oid::regclass AS rel, a.attname AS col, g.rolname AS grantee
               FROM pg_class c
               JOIN pg_attribute a ON a.attrelid = c.oid AND a.attacl IS NOT NULL AND NOT a.attisdropped
               CROSS JOIN LATERAL aclexplode(a.attacl) x
               JOIN pg_roles g ON g.oid = x.grantee
              WHERE c.relnamespace = 'onceflow'::regnamespace
                AND g.rolname IN (v_writer, v_relay, v_consumer, v_reader)
    LOOP
        EXECUTE format('REVOKE ALL (%I) ON %s FROM %I', r.col, r.rel, r.grantee);
    END LOOP;
    EXECUTE format('GRANT USAGE ON SCHEMA onceflow TO %s', v_apps);
    -- Every role may read the schema's version: the engines check it at
    -- start and fail fast, naming `migrate`, on a database that lacks
    -- migrations (pkg/schema.Check).
    IF to_regclass('onceflow.schema_version') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON onceflow.schema_version TO %s', v_apps);
    END IF;

    -- Writer: enqueue only. onceflow.enqueue (and enqueue_batch) runs with the caller's rights,
    -- so the writer holds exactly what it (and the Go API's single INSERT)
    -- does: insert the event, read back the event id and seq (column SELECT
    -- on those two only: payloads stay unreadable). The seq comes from the
    -- stream's counter in onceflow.source_seq, locked and moved only by
    -- functions with their owner's rights (migration 015: the outbox's
    -- triggers, and onceflow.next_seqs, which locks a batch's counters and
    -- tells it its seqs): the writer holds nothing on the counters, so it
    -- can neither choose a seq (an INSERT naming a seq other than the
    -- stream's next is refused) nor wind back, max out or lock another
    -- stream's counter outside enqueueing.
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
              WHERE p.pronamespace = 'onceflow'::regnamespace AND p.proname IN ('enqueue', 'enqueue_batch', 'next_seqs')
    LOOP
        EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %I', r.fn, v_writer);
    END LOOP;
    -- Before migration 015 the enqueue statements wrote the per-source
    -- counters with the writer's rights.
    IF to_regclass('onceflow.source_seq') IS NOT NULL
       AND to_regprocedure('onceflow.outbox_assign_seq()') IS NULL THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON onceflow.source_seq TO %I', v_writer);
    END IF;
    IF to_regclass('onceflow.outbox') IS NOT NULL THEN
        EXECUTE format('GRANT INSERT (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload), '
                       'SELECT (event_id, seq) ON onceflow.outbox TO %I', v_writer);
        -- Relay: read, prune (and -delete-on-publish). Rows are never updated.
        EXECUTE format('GRANT SELECT, DELETE ON onceflow.outbox TO %I', v_relay);
    END IF;
    -- The partitioned outbox's event_ids (migration 034) are indexed in its
    -- key table only: the writer may look its events up there (whether a
    -- commit whose outcome it did not learn went through), as it may read
    -- onceflow.outbox's event_id. The keys themselves are written by the
    -- outbox's triggers with their owner's rights.
    IF to_regclass('onceflow.outbox_keys') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT (event_id) ON onceflow.outbox_keys TO %I', v_writer);
    END IF;
    -- Relay: the queue of unpublished ids (filled by a trigger that runs with
    -- its owner's rights: producers need nothing here) and the publish log
    -- (UPDATE only for the row locks of its pruning).
    IF to_regclass('onceflow.outbox_pending') IS NOT NULL THEN
        -- INSERT: the leader's sweep queues rows written while the
        -- outbox's triggers did not fire (docs/relay.md).
        EXECUTE format('GRANT SELECT, INSERT, DELETE ON onceflow.outbox_pending TO %I', v_relay);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON onceflow.outbox_published TO %I', v_relay);
    END IF;
    IF to_regclass('onceflow.relay_lease') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON onceflow.relay_lease TO %I', v_relay);
    END IF;
    -- Relay shards: the shard of a source, and (after a change of the shard
    -- count) deleting the settled leases of the old count.
    IF to_regprocedure('onceflow.source_shard(text, integer)') IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.source_shard(text, integer) TO %I', v_relay);
        EXECUTE format('GRANT DELETE ON onceflow.relay_lease TO %I', v_relay);
    END IF;
    -- Relay: its database identity (bound, re-minted, adopted or reset),
    -- legacy checkpoints, set-aside rows, and the outbox id sequence's last
    -- value (a checkpoint naming higher ids means a restored database).
    IF to_regclass('onceflow.database_identity') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT, UPDATE ON onceflow.database_identity TO %I', v_relay);
        EXECUTE format('GRANT SELECT, UPDATE ON onceflow.relay_legacy_checkpoint TO %I', v_relay);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON onceflow.outbox_set_aside TO %I', v_relay);
    END IF;
    IF to_regclass('onceflow.outbox') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON SEQUENCE %s TO %I', pg_get_serial_sequence('onceflow.outbox', 'id'), v_relay);
    END IF;
    -- The relay's scan floor rises by marks (migration 024).
    IF to_regprocedure('onceflow.outbox_scan_mark()') IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.outbox_scan_mark() TO %I', v_relay);
    END IF;
    -- The partitioned outbox (migration 034): the relay's retention makes
    -- the id-range partitions ahead of the ids, and empties and drops them
    -- (with their keys in onceflow.outbox_keys), through functions that run
    -- with the owner's rights; its row-by-row prune deletes keys through
    -- the outbox's trigger, with the owner's rights too.
    IF to_regclass('onceflow.outbox_partitions') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON onceflow.outbox_partitions TO %I', v_relay);
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.outbox_ensure_partitions(bigint), '
                       'onceflow.outbox_expire_partition(bigint, interval), '
                       'onceflow.outbox_drop_partition(bigint) TO %I', v_relay);
    END IF;
    -- The partitioned publish log (migration 035): the relay's retention
    -- drops its partitions through a function that runs with the owner's
    -- rights; its row-by-row prune reads their list to leave them alone.
    IF to_regclass('onceflow.outbox_published_partitions') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON onceflow.outbox_published_partitions TO %I', v_relay);
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.outbox_published_drop_partitions(interval) TO %I', v_relay);
    END IF;

    -- Consumer: its ledgers and state.
    FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
              WHERE c.relnamespace = 'onceflow'::regnamespace AND c.relkind IN ('r', 'p')
                AND c.relname IN ('inbox', 'consumer_offsets', 'seq_state', 'seq_applied', 'seq_gaps', 'effects')
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %I', r.rel, v_consumer);
    END LOOP;
    -- The partitioned inbox (migration 028): retention deletes row by row
    -- only in the legacy and default partitions, publishes its classes, and
    -- makes, truncates and drops bucket partitions through functions that
    -- run with the owner's rights.
    IF to_regclass('onceflow.inbox_classes') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT, DELETE ON onceflow.inbox_legacy, onceflow.inbox_default TO %I', v_consumer);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON onceflow.inbox_classes TO %I', v_consumer);
        EXECUTE format('GRANT SELECT ON onceflow.inbox_lanes, onceflow.inbox_buckets TO %I', v_consumer);
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.inbox_lane(text, text), '
                       'onceflow.inbox_ensure_buckets(text, text, timestamptz), '
                       'onceflow.inbox_expire_bucket(text, text, timestamptz), '
                       'onceflow.inbox_drop_bucket(text, text, timestamptz) TO %I', v_consumer);
    END IF;
    -- Sealed buckets and the filters of their ids (migration 037):
    -- retention seals a bucket and stores its filter through functions
    -- that run with the owner's rights; the consumer reads the filters.
    IF to_regclass('onceflow.inbox_filters') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON onceflow.inbox_filters TO %I', v_consumer);
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.inbox_seal_bucket(text, text, timestamptz), '
                       'onceflow.inbox_put_filter(text, text, timestamptz, bigint, bytea) TO %I', v_consumer);
    END IF;
    -- When the dedup probe's time bound took effect (migration 036).
    IF to_regclass('onceflow.inbox_id_time') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON onceflow.inbox_id_time TO %I', v_consumer);
    END IF;
    -- The function the constraint inbox_id_time calls (migration 038): it
    -- runs with the rights of the role writing the inbox row.
    IF to_regprocedure('onceflow.inbox_id_time_holds(text, text, timestamptz)') IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.inbox_id_time_holds(text, text, timestamptz) TO %I', v_consumer);
    END IF;
    -- The partitioned effects ledger (migration 032): retention deletes row
    -- by row only in the legacy and default partitions, and makes,
    -- truncates and drops a consumer's bucket partitions through functions
    -- that run with the owner's rights.
    IF to_regclass('onceflow.effects_buckets') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT, DELETE ON onceflow.effects_legacy, onceflow.effects_default TO %I', v_consumer);
        EXECUTE format('GRANT SELECT ON onceflow.effects_buckets TO %I', v_consumer);
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.effects_ensure_buckets(text, bigint, timestamptz), '
                       'onceflow.effects_keep_bucket_rows(text, text, timestamptz), '
                       'onceflow.effects_expire_bucket(text, text, timestamptz), '
                       'onceflow.effects_drop_bucket(text, timestamptz) TO %I', v_consumer);
    END IF;
    -- The effects ledger's protocol functions (effects.Do, and fences from
    -- other languages, run them with the caller's rights).
    FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p
              WHERE p.pronamespace = 'onceflow'::regnamespace AND p.proname LIKE 'effect\_%'
    LOOP
        EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %I', r.fn, v_consumer);
    END LOOP;
    -- Console (docs/console.md): the consumer records operator changes in
    -- the audit (never deletes them), and the consumer and the relay may read
    -- the relay's status through onceflow.relay_status(), which shows counts
    -- and leases, never outbox payloads.
    IF to_regclass('onceflow.admin_audit') IS NOT NULL THEN
        -- Append-only (migration 018): a change is recorded, then finished
        -- once (outcome, result; finished_at is the database's clock).
        EXECUTE format('GRANT SELECT, INSERT, UPDATE (outcome, result, finished_at) ON onceflow.admin_audit TO %I', v_consumer);
    END IF;
    -- Reconcile (`consumer reconcile`, migration 023): the run's summary
    -- is its one write; the console shows the last one.
    IF to_regclass('onceflow.reconcile_runs') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT, INSERT ON onceflow.reconcile_runs TO %I, %I', v_consumer, v_reader);
    END IF;
    -- Reader (`consumer reconcile` with least privilege): the columns its
    -- reads name, no payload, header or error text; nothing else.
    IF to_regclass('onceflow.outbox_pending') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT (id, topic, source, seq, created_at) ON onceflow.outbox TO %I', v_reader);
        EXECUTE format('GRANT SELECT ON onceflow.outbox_pending TO %I', v_reader);
        EXECUTE format('GRANT SELECT (batch, published_at, first_id, last_id, ids) ON onceflow.outbox_published TO %I', v_reader);
    END IF;
    IF to_regclass('onceflow.database_identity') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT (id) ON onceflow.database_identity TO %I', v_reader);
        EXECUTE format('GRANT SELECT (topic, source, seq, resolution) ON onceflow.outbox_set_aside TO %I', v_reader);
    END IF;
    -- (The stream columns came with migration 016.)
    IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('onceflow.seq_gaps') AND attname = 'producer'
                                              AND NOT attisdropped) THEN
        EXECUTE format('GRANT SELECT (consumer, producer, topic, source, seq, status, received_at) ON onceflow.inbox TO %I', v_reader);
        EXECUTE format('GRANT SELECT (group_id, topic, kafka_partition, next_offset) ON onceflow.consumer_offsets TO %I', v_reader);
        EXECUTE format('GRANT SELECT (consumer, producer, topic, source, from_seq, to_seq, state, give_up_reason, closed_at, '
                       'resolved_at, resolved_note) ON onceflow.seq_gaps TO %I', v_reader);
    END IF;
    IF to_regprocedure('onceflow.relay_status()') IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.relay_status() TO %I, %I', v_relay, v_consumer);
    END IF;
    -- The console's list of set-aside outbox rows (identity, reason, error;
    -- no payload), through onceflow.relay_set_aside().
    IF to_regprocedure('onceflow.relay_set_aside(integer)') IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.relay_set_aside(integer) TO %I, %I', v_relay, v_consumer);
    END IF;
    -- Retention (`consumer prune`, `-retention-interval`): the consumer's
    -- pruner deletes audit rows and resolved set-aside rows only through
    -- these functions, which refuse to delete recent ones (30 days, 1 day).
    IF to_regprocedure('onceflow.prune_admin_audit(text, interval, integer)') IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.prune_admin_audit(text, interval, integer) TO %I', v_consumer);
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.prune_outbox_set_aside(interval, integer) TO %I', v_consumer);
    END IF;
    -- Topics no producer may enqueue to (migration 018): the relay
    -- registers its checkpoint topic at start; the consumer may register
    -- its dead-letter topic.
    IF to_regprocedure('onceflow.reserve_topic(text, text)') IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.reserve_topic(text, text) TO %I, %I', v_relay, v_consumer);
    END IF;
    IF v_enqueue THEN
        EXECUTE format('GRANT %I TO %I', v_writer, v_consumer);
    ELSIF pg_has_role(v_consumer, v_writer, 'MEMBER') THEN
        EXECUTE format('REVOKE %I FROM %I', v_writer, v_consumer);
    END IF;
END
$roles$;

COMMIT;
