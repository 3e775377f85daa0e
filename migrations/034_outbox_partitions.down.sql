---- tern: disable-tx ----
-- Back to one plain onceflow.outbox. One transaction holds ACCESS EXCLUSIVE
-- on onceflow.outbox throughout (producers and the relay wait): the legacy
-- partition is detached (or, if retention dropped it, made again), the rows
-- of every other partition are copied into it (its unique constraint on
-- (source, topic, seq), kept through the partitioned time, checks them),
-- the key table goes and the legacy table's unique constraint
-- outbox_event_id_key is built again (a scan of every row, under the same
-- lock), and it becomes onceflow.outbox again, with its identity (a
-- sequence of the same name, where the partitioned table's stood), grants
-- and triggers. Then the functions of migration 029 come back and the
-- objects of 034 go.

SET lock_timeout = '10s';

DO $$
DECLARE
    r        record;
    v_last   bigint;
    v_called boolean;
    v_notify "char";
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.outbox'::regclass) <> 'p' THEN
        RETURN;
    END IF;
    LOCK TABLE onceflow.outbox IN ACCESS EXCLUSIVE MODE;
    SELECT s.last_value, s.is_called INTO v_last, v_called FROM onceflow.outbox_id_seq s;
    SELECT t.tgenabled INTO v_notify FROM pg_trigger t WHERE t.tgrelid = 'onceflow.outbox'::regclass AND t.tgname = 'outbox_notify';
    CREATE TEMPORARY TABLE outbox_034_seq_acl ON COMMIT DROP AS
        SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'onceflow.outbox_id_seq'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0;
    -- Its primary key holds the name outbox_event_id_key.
    DROP TABLE onceflow.outbox_keys;

    IF to_regclass('onceflow.outbox_legacy') IS NOT NULL THEN
        ALTER TABLE onceflow.outbox DETACH PARTITION onceflow.outbox_legacy;
        ALTER TABLE onceflow.outbox_legacy DROP CONSTRAINT outbox_legacy_id_range;
    ELSE
        -- Retention dropped the legacy partition: a new table of the same
        -- shape, keys and grants takes every row.
        CREATE TABLE onceflow.outbox_legacy (LIKE onceflow.outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
        ALTER TABLE onceflow.outbox_legacy ALTER COLUMN id DROP DEFAULT;
        ALTER TABLE onceflow.outbox_legacy ADD CONSTRAINT outbox_legacy_pkey PRIMARY KEY (id),
            ADD CONSTRAINT outbox_source_topic_seq_key UNIQUE (source, topic, seq);
        FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
                  WHERE c.oid = 'onceflow.outbox'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
        LOOP
            EXECUTE format('GRANT %s ON onceflow.outbox_legacy TO %s', r.privilege_type, r.grantee::regrole);
        END LOOP;
        FOR r IN SELECT att.attname, a.grantee, a.privilege_type FROM pg_attribute att, aclexplode(att.attacl) a
                  WHERE att.attrelid = 'onceflow.outbox'::regclass AND att.attacl IS NOT NULL AND NOT att.attisdropped
                    AND a.grantee <> 0
        LOOP
            EXECUTE format('GRANT %s (%I) ON onceflow.outbox_legacy TO %s', r.privilege_type, r.attname, r.grantee::regrole);
        END LOOP;
    END IF;
    INSERT INTO onceflow.outbox_legacy SELECT * FROM onceflow.outbox;
    DROP TABLE onceflow.outbox;
    ALTER TABLE onceflow.outbox_legacy ADD CONSTRAINT outbox_event_id_key UNIQUE (event_id);

    ALTER TABLE onceflow.outbox_legacy RENAME TO outbox;
    ALTER TABLE onceflow.outbox RENAME CONSTRAINT outbox_legacy_pkey TO outbox_pkey;
    ALTER TABLE onceflow.outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME onceflow.outbox_id_seq CACHE 1);
    PERFORM setval('onceflow.outbox_id_seq', v_last, v_called);
    FOR r IN SELECT * FROM outbox_034_seq_acl LOOP
        EXECUTE format('GRANT %s ON SEQUENCE onceflow.outbox_id_seq TO %s', r.privilege_type, r.grantee::regrole);
    END LOOP;

    CREATE TRIGGER outbox_assign_seq BEFORE INSERT ON onceflow.outbox
        FOR EACH ROW WHEN (NEW.seq IS NULL) EXECUTE FUNCTION onceflow.outbox_assign_seq();
    CREATE TRIGGER outbox_check_seq AFTER INSERT ON onceflow.outbox
        REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_check_seq();
    CREATE TRIGGER outbox_guard AFTER INSERT ON onceflow.outbox
        REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_guard();
    CREATE TRIGGER outbox_pending_insert AFTER INSERT ON onceflow.outbox
        REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_pending_insert();
    CREATE TRIGGER outbox_pending_delete AFTER DELETE ON onceflow.outbox
        REFERENCING OLD TABLE AS outbox_old FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_pending_delete();
    CREATE TRIGGER outbox_pending_truncate AFTER TRUNCATE ON onceflow.outbox
        FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_pending_truncate();
    CREATE TRIGGER outbox_notify AFTER INSERT ON onceflow.outbox
        FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_notify();
    IF v_notify = 'D' THEN
        ALTER TABLE onceflow.outbox DISABLE TRIGGER outbox_notify;
    END IF;
END $$;

-- A run of the up file that stopped before its last step.
DROP TRIGGER IF EXISTS outbox_keys_insert ON onceflow.outbox;
DROP TRIGGER IF EXISTS outbox_keys_delete ON onceflow.outbox;
DROP TRIGGER IF EXISTS outbox_keys_truncate ON onceflow.outbox;
DROP TABLE IF EXISTS onceflow.outbox_keys;
ALTER TABLE onceflow.outbox DROP CONSTRAINT IF EXISTS outbox_legacy_id_range;
DROP INDEX IF EXISTS onceflow.outbox_legacy_event_id;
DROP INDEX IF EXISTS onceflow.outbox_legacy_stream;

DROP FUNCTION IF EXISTS onceflow.outbox_drop_partition(bigint);
DROP FUNCTION IF EXISTS onceflow.outbox_expire_partition(bigint, interval);
DROP FUNCTION IF EXISTS onceflow.outbox_ensure_partitions(bigint);
DROP FUNCTION IF EXISTS onceflow.outbox_keys_insert();
DROP FUNCTION IF EXISTS onceflow.outbox_keys_delete();
DROP FUNCTION IF EXISTS onceflow.outbox_keys_truncate();
DROP TABLE IF EXISTS onceflow.outbox_partitions;

-- outbox_assign_seq as migration 029 left it.
CREATE OR REPLACE FUNCTION onceflow.outbox_assign_seq()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
    v_last := greatest(v_last, coalesce((SELECT m.last_seq FROM onceflow.source_seq_moves m
                          WHERE m.source = NEW.source AND m.topic = NEW.topic
                          ORDER BY m.last_seq DESC LIMIT 1), 0));
    -- Only rows above the counter can be this statement's: the bound keeps
    -- the walk off the entries of rows deleted (published and pruned, or
    -- -delete-on-publish) that an old snapshot keeps in the index.
    SELECT o.seq, o.id INTO v_top, v_top_id FROM onceflow.outbox o
     WHERE o.source = NEW.source AND o.topic = NEW.topic AND o.seq > v_last
     ORDER BY o.seq DESC
     LIMIT 1;
    IF NOT FOUND THEN
        -- The row holding the counter's seq (gone once deleted): the new
        -- row's id must come after its id, as onceflow.outbox_check_seq
        -- checks.
        SELECT o.id INTO v_top_id FROM onceflow.outbox o
         WHERE o.source = NEW.source AND o.topic = NEW.topic AND o.seq = v_last;
    END IF;
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
$function$;

-- outbox_check_seq as migration 029 left it.
CREATE OR REPLACE FUNCTION onceflow.outbox_check_seq()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    r      record;
    v_last bigint;
    v_prev bigint;
    v_moved bigint;
BEGIN
    -- Per stream the statement wrote, in the lock order: its seqs in id
    -- order, and whether each is one more than the one before.
    FOR r IN SELECT x.source, x.topic, min(x.seq) AS lo, max(x.seq) AS hi, min(x.id) AS first_id,
                    bool_and(x.next) AS in_order
               FROM (SELECT n.source, n.topic, n.seq, n.id,
                            coalesce(n.seq = lag(n.seq) OVER (PARTITION BY n.source, n.topic ORDER BY n.id) + 1, true) AS next
                       FROM outbox_new n) x
              GROUP BY x.source, x.topic
              ORDER BY x.source, x.topic LOOP
        SELECT c.last_seq INTO v_last FROM onceflow.source_seq c
         WHERE c.source = r.source AND c.topic = r.topic
           FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO onceflow.source_seq AS c (source, topic, last_seq)
            VALUES (r.source, r.topic,
                    coalesce((SELECT l.last_seq FROM onceflow.source_seq_legacy l WHERE l.source = r.source), 0))
            ON CONFLICT (source, topic) DO NOTHING;
            SELECT c.last_seq INTO STRICT v_last FROM onceflow.source_seq c
             WHERE c.source = r.source AND c.topic = r.topic
               FOR UPDATE;
        END IF;
        -- The counter's newest move (migration 029): the stream's last seq is
        -- the greater of it and the locked row's value.
        SELECT m.last_seq INTO v_moved FROM onceflow.source_seq_moves m
         WHERE m.source = r.source AND m.topic = r.topic
         ORDER BY m.last_seq DESC LIMIT 1;
        v_last := greatest(v_last, v_moved);
        SELECT o.id INTO v_prev FROM onceflow.outbox o
         WHERE o.source = r.source AND o.topic = r.topic AND o.seq = v_last;
        IF r.lo <> v_last + 1 OR NOT r.in_order OR v_prev >= r.first_id THEN
            RAISE EXCEPTION 'onceflow.outbox: source % on topic %: the rows carry seqs % to %, but the stream''s next seqs are % on, in id order',
                quote_literal(r.source), quote_literal(r.topic), r.lo, r.hi, v_last + 1
                USING ERRCODE = '23514',
                      HINT = 'Leave seq out: the database gives each row its seq (onceflow.next_seqs tells a batch its seqs).';
        END IF;
        -- Move the counter: the new value in, the previous move out by its
        -- exact key. The row in source_seq is only locked, never updated.
        INSERT INTO onceflow.source_seq_moves (source, topic, last_seq) VALUES (r.source, r.topic, r.hi);
        IF v_moved IS NOT NULL THEN
            DELETE FROM onceflow.source_seq_moves m
             WHERE m.source = r.source AND m.topic = r.topic AND m.last_seq = v_moved;
        END IF;
    END LOOP;
    RETURN NULL;
END
$function$;
