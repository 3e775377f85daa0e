---- tern: disable-tx ----
-- Back to one plain onceflow.outbox_published. One transaction holds
-- ACCESS EXCLUSIVE on onceflow.outbox_published throughout (the relay's
-- marks and prunes wait): the legacy partition is detached (or, if
-- retention dropped it, made again with the same columns, primary key on
-- batch, indexes and grants), the rows of every other partition are copied
-- into it, the partitioned table goes, and the legacy table becomes
-- onceflow.outbox_published again, with its identity (a sequence of the
-- same name, where the partitioned table's stood). Then
-- outbox_ensure_partitions and outbox_expire_partition as migration 034
-- left them come back, and the objects of 035 go.

SET lock_timeout = '10s';

DO $$
DECLARE
    r        record;
    v_last   bigint;
    v_called boolean;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.outbox_published'::regclass) <> 'p' THEN
        RETURN;
    END IF;
    LOCK TABLE onceflow.outbox_published IN ACCESS EXCLUSIVE MODE;
    SELECT s.last_value, s.is_called INTO v_last, v_called FROM onceflow.outbox_published_batch_seq s;
    CREATE TEMPORARY TABLE outbox_035_seq_acl ON COMMIT DROP AS
        SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'onceflow.outbox_published_batch_seq'::regclass AND a.grantee <> c.relowner;

    IF to_regclass('onceflow.outbox_published_legacy') IS NOT NULL THEN
        ALTER TABLE onceflow.outbox_published DETACH PARTITION onceflow.outbox_published_legacy;
        ALTER TABLE onceflow.outbox_published_legacy DROP CONSTRAINT IF EXISTS outbox_published_legacy_range;
    ELSE
        -- Retention dropped the legacy partition: a new table of the same
        -- shape takes every row.
        CREATE TABLE onceflow.outbox_published_legacy (LIKE onceflow.outbox_published INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
        ALTER TABLE onceflow.outbox_published_legacy ADD CONSTRAINT outbox_published_legacy_pkey PRIMARY KEY (batch);
        CREATE INDEX outbox_published_legacy_published_at ON onceflow.outbox_published_legacy (published_at);
        CREATE INDEX outbox_published_legacy_last_id ON onceflow.outbox_published_legacy (last_id);
        CREATE INDEX outbox_published_legacy_id_span ON onceflow.outbox_published_legacy USING gist (int8range(first_id, last_id, '[]'));
    END IF;
    -- The partitioned table's grants, table and column level (they were
    -- the old table's, and roles.sql may have granted more since).
    FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.outbox_published'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON onceflow.outbox_published_legacy TO %s', r.privilege_type,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
    FOR r IN SELECT att.attname, a.grantee, a.privilege_type FROM pg_attribute att, aclexplode(att.attacl) a
              WHERE att.attrelid = 'onceflow.outbox_published'::regclass AND att.attacl IS NOT NULL AND NOT att.attisdropped
    LOOP
        EXECUTE format('GRANT %s (%I) ON onceflow.outbox_published_legacy TO %s', r.privilege_type, r.attname,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
    INSERT INTO onceflow.outbox_published_legacy (batch, published_at, first_id, last_id, ids)
    SELECT batch, published_at, first_id, last_id, ids FROM onceflow.outbox_published;
    DROP TABLE onceflow.outbox_published;
    ALTER TABLE onceflow.outbox_published_legacy DROP CONSTRAINT IF EXISTS outbox_published_legacy_batch_key;

    ALTER TABLE onceflow.outbox_published_legacy RENAME TO outbox_published;
    ALTER TABLE onceflow.outbox_published RENAME CONSTRAINT outbox_published_legacy_pkey TO outbox_published_pkey;
    ALTER INDEX onceflow.outbox_published_legacy_published_at RENAME TO outbox_published_published_at;
    ALTER INDEX onceflow.outbox_published_legacy_last_id RENAME TO outbox_published_last_id;
    ALTER INDEX onceflow.outbox_published_legacy_id_span RENAME TO outbox_published_id_span;
    ALTER TABLE onceflow.outbox_published ALTER COLUMN batch ADD GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME onceflow.outbox_published_batch_seq);
    PERFORM setval('onceflow.outbox_published_batch_seq', v_last, v_called);
    FOR r IN SELECT * FROM outbox_035_seq_acl LOOP
        EXECUTE format('GRANT %s ON SEQUENCE onceflow.outbox_published_batch_seq TO %s', r.privilege_type,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
END $$;

-- A run of the up file that stopped before its last step.
ALTER TABLE onceflow.outbox_published DROP CONSTRAINT IF EXISTS outbox_published_legacy_range;
DROP INDEX IF EXISTS onceflow.outbox_published_legacy_batch_key;

-- outbox_ensure_partitions and outbox_expire_partition as migration 034
-- left them.
CREATE OR REPLACE FUNCTION onceflow.outbox_ensure_partitions(p_width bigint DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $fn$
DECLARE
    v_from bigint;
    v_w    bigint;
    v_last bigint;
    v_end  bigint;
    v_name text;
    v_made integer := 0;
BEGIN
    IF p_width IS NOT NULL AND p_width < 1 THEN
        RAISE EXCEPTION 'onceflow.outbox_ensure_partitions: width must be positive, got %', p_width USING ERRCODE = '22023';
    END IF;
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'onceflow.outbox'::regclass) <> 'p' THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock(x'0b0e'::integer, 0);
    SELECT p.to_id, CASE WHEN p.from_id = -9223372036854775808 THEN 1000000 ELSE p.to_id - p.from_id END
      INTO v_from, v_w
      FROM onceflow.outbox_partitions p ORDER BY p.to_id DESC LIMIT 1;
    v_w := coalesce(p_width, v_w);
    -- The ids drawn: the sequence's, or the table's highest id where rows
    -- come with their ids (a logical-replication subscriber).
    v_last := greatest(coalesce(pg_sequence_last_value('onceflow.outbox_id_seq'::regclass), 0),
                       coalesce((SELECT max(o.id) FROM onceflow.outbox o), 0));
    -- Until the newest range starts above the last id drawn; above the
    -- legacy partition, one range at least.
    v_end := greatest(v_last + v_w, CASE WHEN NOT EXISTS (SELECT 1 FROM onceflow.outbox_partitions p WHERE p.from_id > -9223372036854775808)
                                         THEN v_from END);
    WHILE v_from <= v_end AND v_made < 100 LOOP
        v_name := 'outbox_p_' || v_from;
        BEGIN
            EXECUTE format('CREATE TABLE onceflow.%I (LIKE onceflow.outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS, CONSTRAINT %I CHECK (id >= %s AND id < %s))',
                           v_name, v_name || '_range', v_from, v_from + v_w);
            EXECUTE format('ALTER TABLE onceflow.outbox ATTACH PARTITION onceflow.%I FOR VALUES FROM (%s) TO (%s)', v_name, v_from, v_from + v_w);
        EXCEPTION WHEN check_violation THEN
            -- The default partition holds ids of this range: the next
            -- range is still made, so the ids leave it from then on. The
            -- range is recorded as taken by the default partition.
            v_name := 'outbox_default';
        END;
        IF v_name <> 'outbox_default' THEN
            INSERT INTO onceflow.outbox_partitions (from_id, to_id, relname) VALUES (v_from, v_from + v_w, v_name);
            v_made := v_made + 1;
        ELSE
            INSERT INTO onceflow.outbox_partitions (from_id, to_id, relname, truncated_at)
            VALUES (v_from, v_from + v_w, 'outbox_default@' || v_from, now());
        END IF;
        v_from := v_from + v_w;
    END LOOP;
    RETURN v_made;
END
$fn$;

CREATE OR REPLACE FUNCTION onceflow.outbox_expire_partition(p_from bigint, p_keep interval)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
SET enable_seqscan = off
AS $fn$
DECLARE
    p      record;
    v_rows bigint;
    v_top  bigint;
BEGIN
    SELECT * INTO p FROM onceflow.outbox_partitions x WHERE x.from_id = p_from AND x.relname NOT LIKE 'outbox\_default@%';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'onceflow.outbox_expire_partition: no partition from %', p_from USING ERRCODE = '22023';
    END IF;
    IF greatest(coalesce(pg_sequence_last_value('onceflow.outbox_id_seq'::regclass), 0),
                coalesce((SELECT max(o.id) FROM onceflow.outbox o), 0)) < p.to_id - 1 THEN
        RETURN NULL;
    END IF;
    EXECUTE format('LOCK TABLE onceflow.%I IN ACCESS EXCLUSIVE MODE', p.relname);
    IF EXISTS (SELECT 1 FROM onceflow.outbox_pending q WHERE q.id >= p.from_id AND q.id < p.to_id)
       OR EXISTS (SELECT 1 FROM onceflow.outbox_set_aside a
                   WHERE a.outbox_id >= p.from_id AND a.outbox_id < p.to_id AND a.resolved_at IS NULL)
       OR EXISTS (SELECT 1 FROM onceflow.outbox_published l
                   WHERE int8range(l.first_id, l.last_id, '[]') && int8range(p.from_id, p.to_id)
                     AND l.published_at >= now() - p_keep) THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT count(*) FROM onceflow.%I', p.relname) INTO v_rows;
    EXECUTE format('TRUNCATE onceflow.%I', p.relname);
    -- The range's event_ids are free again (row by row, but the key
    -- table's rows are narrow: docs/relay.md gives the time per 1M keys).
    DELETE FROM onceflow.outbox_keys k WHERE k.id >= p.from_id AND k.id < p.to_id;
    UPDATE onceflow.outbox_partitions x SET truncated_at = now() WHERE x.from_id = p_from;
    SELECT max(l.last_id) INTO v_top FROM onceflow.outbox_published l;
    DELETE FROM onceflow.outbox_published l
     WHERE int8range(l.first_id, l.last_id, '[]') && int8range(p.from_id, p.to_id)
       AND l.last_id < v_top
       AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_partitions x
                        WHERE x.truncated_at IS NULL AND int8range(x.from_id, x.to_id) && int8range(l.first_id, l.last_id, '[]'));
    RETURN v_rows;
END
$fn$;

DROP FUNCTION IF EXISTS onceflow.outbox_published_drop_partitions(interval);
DROP FUNCTION IF EXISTS onceflow.outbox_published_ensure_partitions();
DROP TABLE IF EXISTS onceflow.outbox_published_partitions;
