-- The relay's scan floor (docs/relay.md, "How the poll stays cheap under old
-- snapshots").
--
-- The relay walks onceflow.outbox_pending in id order. An entry deleted
-- while some snapshot is open stays in the index until vacuum may remove
-- it, so a poll that starts at the lowest id walks every entry published
-- since the oldest snapshot. The relay now starts its walk above a floor:
-- an id below which nothing is pending and nothing can still become
-- pending. To know that, it must know that every id at or below some value
-- was drawn by a transaction that has ended. This migration makes that
-- knowable: every id is drawn by a transaction that already has its xid, so
-- that a transaction that drew an id is still running exactly as long as
-- its xid is, and once every xid assigned before the relay read the
-- sequence has ended, every row with a lower id is committed (and visible)
-- or never will be.
--
--   * outbox_assign_seq (rows inserted without a seq: Enqueue,
--     onceflow.enqueue, a hand-written INSERT) draws the row's id again when
--     the transaction had no xid as the identity drew it (the counter's row
--     lock gives it one; an INSERT naming its own id in a transaction that
--     has written nothing yet gets a new id);
--   * onceflow.enqueue and Go's Enqueue take the xid before their INSERT, so
--     that the trigger keeps the identity's id (ids stay consecutive);
--   * the batch statements (EnqueueBatch, onceflow.enqueue_batch) call
--     onceflow.next_seqs, whose row locks give the transaction its xid before
--     the statement forms its rows (their ids are drawn above a sort of the
--     rows joined to next_seqs' result), so nothing changes for them;
--   * onceflow.outbox_scan_mark() reads the sequence's last value and then
--     takes an xid: every id at or below the value was drawn by a
--     transaction with a lower xid, so a snapshot whose xmin is at least the
--     mark's xid sees every such row that will ever commit;
--   * the sequence keeps CACHE 1 (the identity's default; set explicitly),
--     so that its last value is the highest id handed out to any session.

ALTER SEQUENCE onceflow.outbox_id_seq CACHE 1;

CREATE OR REPLACE FUNCTION onceflow.outbox_assign_seq() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_last   bigint;
    v_top    bigint;
    v_top_id bigint;
    v_why    text;
    v_fresh  boolean := pg_current_xact_id_if_assigned() IS NULL;
BEGIN
    -- A row without a source or topic fails the outbox's own NOT NULL
    -- constraint: leave it to that, with its usual error.
    IF NEW.source IS NULL OR NEW.topic IS NULL THEN
        RETURN NEW;
    END IF;
    v_why := onceflow.source_refusal(NEW.source, NULL);
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow.outbox: %', v_why USING ERRCODE = '42501';
    END IF;
    SELECT c.last_seq INTO v_last FROM onceflow.source_seq c
     WHERE c.source = NEW.source AND c.topic = NEW.topic
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO onceflow.source_seq AS c (source, topic, last_seq)
        VALUES (NEW.source, NEW.topic,
                coalesce((SELECT l.last_seq FROM onceflow.source_seq_legacy l WHERE l.source = NEW.source), 0))
        ON CONFLICT (source, topic) DO NOTHING;
        SELECT c.last_seq INTO STRICT v_last FROM onceflow.source_seq c
         WHERE c.source = NEW.source AND c.topic = NEW.topic
           FOR UPDATE;
    END IF;
    -- The counter is current as of the end of the last statement; this
    -- statement's earlier rows of the stream come after it.
    SELECT o.seq, o.id INTO v_top, v_top_id FROM onceflow.outbox o
     WHERE o.source = NEW.source AND o.topic = NEW.topic
     ORDER BY o.seq DESC
     LIMIT 1;
    NEW.seq := greatest(v_last, v_top) + 1;
    -- An id drawn before the transaction had an xid (the column's identity
    -- draws it before this trigger runs) is drawn again, now that the
    -- counter's lock gave the transaction one: the relay's scan floor
    -- relies on every id being drawn by a transaction that already has its
    -- xid (migration 024).
    IF NEW.id IS NULL OR NEW.id <= v_top_id OR v_fresh THEN
        PERFORM pg_current_xact_id();
        NEW.id := nextval('onceflow.outbox_id_seq');
    END IF;
    RETURN NEW;
END
$fn$;

-- onceflow.enqueue takes its xid before its INSERT: its current body
-- (whatever migration wrote it last) gets one statement before the INSERT,
-- and nothing else changes.
DO $do$
DECLARE
    v_def text := pg_get_functiondef('onceflow.enqueue(text, text, text, jsonb, text, jsonb, text, text, text)'::regprocedure);
    v_at  constant text := '    -- The seq: the trigger outbox_assign_seq''s, from the stream''s counter.';
    v_add constant text := E'    -- The xid before the row''s id is drawn (the relay''s scan floor,\n'
                           '    -- migration 024), so that the trigger keeps the id.\n'
                           '    PERFORM pg_current_xact_id();\n';
BEGIN
    IF (length(v_def) - length(replace(v_def, v_at, ''))) / length(v_at) <> 1 THEN
        RAISE EXCEPTION 'migration 024: onceflow.enqueue does not hold its INSERT''s comment exactly once';
    END IF;
    EXECUTE replace(v_def, v_at, v_add || v_at);
END
$do$;

-- What the relay's floor rises by: the highest id drawn so far, then the
-- xid of this call's transaction, which is higher than the xid of every
-- transaction that drew one of those ids.
CREATE FUNCTION onceflow.outbox_scan_mark(OUT last_id bigint, OUT mark_xid xid8)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    last_id := coalesce(pg_sequence_last_value('onceflow.outbox_id_seq'::regclass), 0);
    mark_xid := pg_current_xact_id();
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_scan_mark() FROM PUBLIC;

-- The function belongs to the outbox's owner (when the migrator may hand it
-- over); whoever may read the sequence (the relay) may call it.
DO $do$
DECLARE
    v_owner oid := (SELECT relowner FROM pg_class WHERE oid = 'onceflow.outbox'::regclass);
    r       record;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.outbox_id_seq'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> v_owner LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.outbox_scan_mark() TO %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
    IF v_owner <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
        BEGIN
            EXECUTE format('ALTER FUNCTION onceflow.outbox_scan_mark() OWNER TO %s', quote_ident(pg_get_userbyid(v_owner)));
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;
        END;
    END IF;
END
$do$;
