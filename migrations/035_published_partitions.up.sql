---- tern: disable-tx ----
-- The publish log onceflow.outbox_published becomes a table partitioned by
-- RANGE (last_id), aligned with the outbox's id ranges, so that retention
-- removes a range's log rows by dropping their partition instead of
-- deleting them row by row (docs/relay.md, "Storage layout: the
-- partitioned outbox", the publish log's part).
--
--   onceflow.outbox_published_legacy     the table before this migration:
--                              the batches whose last_id lies below a bound
--                              chosen at step 1 (the end of the first outbox
--                              range that ends at least one range width above
--                              the highest id drawn then). Pruned row by row
--                              as before (the relay's prune, and
--                              outbox_expire_partition for the ranges below
--                              the bound); it drains, and the relay drops it
--                              once the conditions below hold for it.
--   onceflow.outbox_published_p_<from>   the batches whose last_id lies in
--                              the outbox range [from, to): made with the
--                              range by outbox_ensure_partitions, dropped as
--                              a whole, never deleted from.
--   onceflow.outbox_published_default    last_ids no partition takes (a
--                              range whose log partition could not be made,
--                              or was dropped while a late row of it was
--                              still to be published): pruned row by row.
-- onceflow.outbox_published_partitions lists them (the legacy one
-- included; a dropped one stays listed, so that it is not made again).
--
-- Why last_id: a batch's ids all lie at or below its last_id, so once every
-- outbox range below a log partition's end is truncated or dropped (and no
-- outbox row below that end is left, in the default partition either), no
-- batch of the partition names a row still there. A batch that committed
-- late holds ids of an older range as well (its first_id lies there): it
-- sits in its last_id's partition, whose end is above that older range,
-- so the partition waits for the older range too. The relay's
-- housekeeping drops a log partition (onceflow.outbox_published_drop_partitions)
-- when, besides, every id below its end has been drawn, each of its batches
-- was published before the retention, and it does not hold the batch with
-- the highest last_id (the relay's restore check reads it, migration 031).
--
-- Keys. The partition key must be in every unique index of a partitioned
-- table, so the primary key becomes (batch, last_id); batch stays the
-- column's identity (GENERATED ALWAYS, sequence
-- onceflow.outbox_published_batch_seq, set where the old one stood, so the
-- batch numbers go on increasing). The legacy partition keeps its own
-- primary key on batch. The indexes on published_at and last_id carry over.
--
-- The steps run in separate transactions (this file runs without an
-- enclosing one), each taking one short lock; producers and the relay keep
-- running:
--   1. the partitions' table, the functions, and the check last_id < bound
--      NOT VALID on the log (ACCESS EXCLUSIVE on onceflow.outbox_published,
--      a catalog update only; the relay's next mark waits for it);
--   2. VALIDATE the check: SHARE UPDATE EXCLUSIVE (a scan of the log;
--      the relay's marks and prunes go on);
--   3. CREATE UNIQUE INDEX CONCURRENTLY on (batch, last_id), which the
--      partitioned table's primary key adopts: SHARE UPDATE EXCLUSIVE
--      (writes go on);
--   4. last, one transaction renames the table to
--      onceflow.outbox_published_legacy, creates the partitioned
--      onceflow.outbox_published with the same columns, check, identity,
--      grants (table and column) and indexes, attaches the old table as the
--      partition of the last_ids below the bound (the validated check
--      spares the scan; its indexes become the partition's), and makes the
--      default partition and the partitions of the outbox ranges above the
--      bound: ACCESS EXCLUSIVE on the old table for catalog work only.
--      Until it commits, every step may be run again.
-- The batches published between step 1 and step 4 must have last_ids below
-- the bound (at least one range width of margin); a batch above it fails
-- the check until step 4 commits, and the relay marks it again.

SET lock_timeout = '10s';

-- Step 1.

-- The publish log's partitions. from_id, to_id: the last_ids it takes;
-- dropped_at: the relay's retention dropped it (or, for a name
-- outbox_published_default@<from>, it could not be made: the default
-- partition held batches of the range).
CREATE TABLE IF NOT EXISTS onceflow.outbox_published_partitions (
    from_id    bigint      PRIMARY KEY,
    to_id      bigint      NOT NULL UNIQUE,
    relname    name        NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now(),
    dropped_at timestamptz,
    CONSTRAINT outbox_published_partitions_range CHECK (to_id > from_id)
);
-- Whoever may read the outbox's ranges may read the log's: the relay's
-- row-by-row prune leaves the batches of the log's range partitions alone.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.outbox_partitions'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
    LOOP
        IF r.grantee = 0 THEN
            GRANT SELECT ON onceflow.outbox_published_partitions TO PUBLIC;
        ELSE
            EXECUTE format('GRANT SELECT ON onceflow.outbox_published_partitions TO %s', r.grantee::regrole);
        END IF;
    END LOOP;
END $$;

-- Makes the publish log's partition of every outbox range above the
-- legacy bound that has none yet: [greatest(from, bound), to), named after
-- the range's first id. Attaching one takes SHARE UPDATE EXCLUSIVE on
-- onceflow.outbox_published and ACCESS EXCLUSIVE on its default partition
-- (a scan of it, which is empty or nearly), each waited for at most 100
-- ms: a partition not made is made at the next call. A range whose
-- batches the default partition already holds gets none (they stay there,
-- pruned row by row). Returns how many it made. outbox_ensure_partitions
-- calls it after making the outbox's ranges.
CREATE OR REPLACE FUNCTION onceflow.outbox_published_ensure_partitions()
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $fn$
DECLARE
    x       record;
    v_bound bigint;
    v_from  bigint;
    v_name  text;
    v_made  integer := 0;
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'onceflow.outbox_published'::regclass) <> 'p' THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock(x'0b0e'::integer, 0);
    SELECT g.to_id INTO STRICT v_bound FROM onceflow.outbox_published_partitions g WHERE g.from_id = -9223372036854775808;
    FOR x IN SELECT p.from_id, p.to_id FROM onceflow.outbox_partitions p
              WHERE p.relname LIKE 'outbox\_p\_%' AND p.to_id > v_bound
                AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_published_partitions g WHERE g.to_id = p.to_id)
              ORDER BY p.from_id
    LOOP
        v_from := greatest(x.from_id, v_bound);
        v_name := 'outbox_published_p_' || x.from_id;
        BEGIN
            EXECUTE format('CREATE TABLE onceflow.%I (LIKE onceflow.outbox_published INCLUDING DEFAULTS INCLUDING CONSTRAINTS, CONSTRAINT %I CHECK (last_id >= %s AND last_id < %s))',
                           v_name, v_name || '_range', v_from, x.to_id);
            EXECUTE format('ALTER TABLE onceflow.outbox_published ATTACH PARTITION onceflow.%I FOR VALUES FROM (%s) TO (%s)', v_name, v_from, x.to_id);
            INSERT INTO onceflow.outbox_published_partitions (from_id, to_id, relname) VALUES (v_from, x.to_id, v_name);
            v_made := v_made + 1;
        EXCEPTION
            WHEN check_violation THEN
                INSERT INTO onceflow.outbox_published_partitions (from_id, to_id, relname, dropped_at)
                VALUES (v_from, x.to_id, 'outbox_published_default@' || x.from_id, now());
            WHEN lock_not_available THEN
                EXIT;
        END;
    END LOOP;
    RETURN v_made;
END
$fn$;

-- outbox_ensure_partitions (migration 034), which now also makes the
-- publish log's partitions of the ranges (outbox_published_ensure_partitions).
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
    -- The publish log's partition of each range (migration 035).
    PERFORM onceflow.outbox_published_ensure_partitions();
    RETURN v_made;
END
$fn$;
-- outbox_expire_partition (migration 034), with one change: the log rows
-- it deletes with an emptied range are only those of the log's legacy and
-- default partitions; a range partition of the log goes whole
-- (outbox_published_drop_partitions). Its reads of the log name a bound
-- on last_id, so that PostgreSQL skips the log's partitions below the
-- range.
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
                   WHERE l.last_id >= p.from_id
                     AND int8range(l.first_id, l.last_id, '[]') && int8range(p.from_id, p.to_id)
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
    -- Row by row only outside the log's range partitions (migration 035).
    -- A range taken by the default partition (outbox_default@…) is listed
    -- as emptied from the start, but its rows stay in the default
    -- partition until the row-by-row prune, which deletes them with their
    -- batches: a batch holding one of them keeps its log row here, or the
    -- row would be neither queued nor logged, which the sweep reads as
    -- never queued (and would publish again).
    DELETE FROM onceflow.outbox_published l
     WHERE l.last_id >= p.from_id
       AND int8range(l.first_id, l.last_id, '[]') && int8range(p.from_id, p.to_id)
       AND l.last_id < v_top
       AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_partitions x
                        WHERE (x.truncated_at IS NULL OR x.relname LIKE 'outbox\_default@%')
                          AND int8range(x.from_id, x.to_id) && int8range(l.first_id, l.last_id, '[]'))
       AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_published_partitions g
                        WHERE g.dropped_at IS NULL AND g.relname LIKE 'outbox\_published\_p\_%'
                          AND l.last_id >= g.from_id AND l.last_id < g.to_id);
    RETURN v_rows;
END
$fn$;

-- Drops the publish log's partitions (the legacy one included) whose
-- batches may all go, oldest first, and returns each one dropped with the
-- batches it held. A partition of last_ids [from, to) goes when
--   - every id below to has been drawn (the sequence, or the outbox's
--     highest id on a logical-replication subscriber),
--   - every outbox range below to is truncated or dropped, and no outbox
--     row with an id below to is left (in the outbox's default partition,
--     or come back into a truncated one): no batch of it names a row that
--     is still there, which the relay's sweep would queue again,
--   - each of its batches was published before now() - p_keep, and
--   - it does not hold the batch with the highest last_id ever published
--     (the relay's restore check reads it).
-- The first two are checked oldest first and end the walk (they hold for a
-- partition only if they hold for every one below it). The last two are
-- checked again under ACCESS EXCLUSIVE on onceflow.outbox_published,
-- taken only when a partition is due and waited for at most 100 ms
-- (SQLSTATE 55P03 then: the caller tries again at its next pass). The
-- relay's marks queue behind the request while it waits, and wait for the
-- DROP, which is catalog work. (Without waiting, NOWAIT, a relay marking
-- without a pause kept the lock from it at every try.) The batches the relay
-- publishes later with last_ids in a dropped partition's range land in
-- the default partition. One caller at a time (the advisory lock 0b0e/2,
-- tried: a second caller returns at once).
CREATE OR REPLACE FUNCTION onceflow.outbox_published_drop_partitions(p_keep interval)
RETURNS TABLE (from_id bigint, batches bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
SET enable_seqscan = off
AS $fn$
DECLARE
    g        record;
    v_drawn  bigint;
    v_top    bigint;
    v_recent boolean;
    v_locked boolean := false;
BEGIN
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = 'onceflow.outbox_published'::regclass) <> 'p' THEN
        RETURN;
    END IF;
    -- One caller at a time (the leaders of several shards run retention):
    -- another one is at it already.
    IF NOT pg_try_advisory_xact_lock(x'0b0e'::integer, 2) THEN
        RETURN;
    END IF;
    v_drawn := greatest(coalesce(pg_sequence_last_value('onceflow.outbox_id_seq'::regclass), 0),
                        coalesce((SELECT max(o.id) FROM onceflow.outbox o), 0));
    FOR g IN SELECT x.from_id, x.to_id, x.relname FROM onceflow.outbox_published_partitions x
              WHERE x.dropped_at IS NULL ORDER BY x.from_id
    LOOP
        IF v_drawn < g.to_id - 1
           OR EXISTS (SELECT 1 FROM onceflow.outbox_partitions p WHERE p.from_id < g.to_id AND p.truncated_at IS NULL)
           OR EXISTS (SELECT 1 FROM onceflow.outbox o WHERE o.id < g.to_id) THEN
            EXIT;
        END IF;
        FOR i IN 1..2 LOOP
            -- First without the lock, then again under it.
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM onceflow.%I l WHERE l.published_at >= now() - $1)', g.relname)
               INTO v_recent USING p_keep;
            SELECT max(l.last_id) INTO v_top FROM onceflow.outbox_published l;
            EXIT WHEN v_recent OR (v_top >= g.from_id AND v_top < g.to_id) OR v_locked;
            LOCK TABLE onceflow.outbox_published IN ACCESS EXCLUSIVE MODE;
            v_locked := true;
        END LOOP;
        CONTINUE WHEN v_recent OR (v_top >= g.from_id AND v_top < g.to_id);
        from_id := g.from_id;
        EXECUTE format('SELECT count(*) FROM onceflow.%I', g.relname) INTO batches;
        EXECUTE format('DROP TABLE onceflow.%I', g.relname);
        UPDATE onceflow.outbox_published_partitions x
           SET relname = 'outbox_published_dropped@' || x.from_id, dropped_at = now()
         WHERE x.from_id = g.from_id;
        RETURN NEXT;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION onceflow.outbox_published_ensure_partitions() FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.outbox_published_drop_partitions(interval) FROM PUBLIC;
-- Whoever may drop the outbox's partitions (the relay) may drop the log's.
DO $$
DECLARE
    v_owner oid := (SELECT p.proowner FROM pg_proc p WHERE p.oid = 'onceflow.outbox_drop_partition(bigint)'::regprocedure);
    r       record;
BEGIN
    FOR r IN SELECT a.grantee FROM pg_proc p, aclexplode(p.proacl) a
              WHERE p.oid = 'onceflow.outbox_drop_partition(bigint)'::regprocedure
                AND a.privilege_type = 'EXECUTE' AND a.grantee <> v_owner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.outbox_published_drop_partitions(interval) TO %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
END $$;

-- The bound of the legacy partition: the end of the first outbox range
-- that ends at least one range width above the ids drawn so far (an
-- existing range's end, or where the housekeeping's next ranges will end),
-- so that the log's partitions line up with the outbox's ranges and the
-- batches published until step 4 stay below it (the housekeeping keeps
-- the same margin of ranges ahead of the ids). Then the check, not yet
-- validated.
DO $$
DECLARE
    v_last  bigint;
    v_w     bigint;
    v_top   bigint;
    v_bound bigint;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.outbox_published'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM onceflow.outbox_published_partitions WHERE from_id = -9223372036854775808) THEN
        v_last := greatest(coalesce(pg_sequence_last_value('onceflow.outbox_id_seq'::regclass), 0),
                           coalesce((SELECT max(id) FROM onceflow.outbox), 0),
                           coalesce((SELECT max(last_id) FROM onceflow.outbox_published), 0));
        SELECT p.to_id, CASE WHEN p.from_id = -9223372036854775808 THEN 1000000 ELSE p.to_id - p.from_id END
          INTO STRICT v_top, v_w
          FROM onceflow.outbox_partitions p ORDER BY p.to_id DESC LIMIT 1;
        SELECT min(p.to_id) INTO v_bound FROM onceflow.outbox_partitions p WHERE p.to_id >= v_last + v_w;
        IF v_bound IS NULL THEN
            v_bound := v_top + (v_last + v_w - v_top + v_w - 1) / v_w * v_w;
        END IF;
        INSERT INTO onceflow.outbox_published_partitions (from_id, to_id, relname)
        VALUES (-9223372036854775808, v_bound, 'outbox_published_legacy');
    END IF;
    SELECT to_id INTO v_bound FROM onceflow.outbox_published_partitions WHERE from_id = -9223372036854775808;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'onceflow.outbox_published'::regclass AND conname = 'outbox_published_legacy_range') THEN
        EXECUTE format('ALTER TABLE onceflow.outbox_published ADD CONSTRAINT outbox_published_legacy_range CHECK (last_id < %s) NOT VALID', v_bound);
    END IF;
END $$;

-- Step 2.
ALTER TABLE onceflow.outbox_published VALIDATE CONSTRAINT outbox_published_legacy_range;

-- Step 3: an index left invalid by an interrupted run is built again.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('onceflow.outbox_published_legacy_batch_key') AND NOT indisvalid) THEN
        DROP INDEX onceflow.outbox_published_legacy_batch_key;
    END IF;
END $$;
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS outbox_published_legacy_batch_key ON onceflow.outbox_published (batch, last_id);

-- Step 4: the swap, one transaction; a failure leaves the plain table, and
-- the file can be run again from the start.
DO $$
DECLARE
    r        record;
    v_last   bigint;
    v_called boolean;
    v_bound  bigint;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.outbox_published'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    LOCK TABLE onceflow.outbox_published IN ACCESS EXCLUSIVE MODE;
    SELECT to_id INTO STRICT v_bound FROM onceflow.outbox_published_partitions WHERE from_id = -9223372036854775808;
    SELECT s.last_value, s.is_called INTO v_last, v_called FROM onceflow.outbox_published_batch_seq s;
    CREATE TEMPORARY TABLE outbox_035_seq_acl ON COMMIT DROP AS
        SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'onceflow.outbox_published_batch_seq'::regclass AND a.grantee <> c.relowner;

    ALTER TABLE onceflow.outbox_published RENAME TO outbox_published_legacy;
    ALTER TABLE onceflow.outbox_published_legacy RENAME CONSTRAINT outbox_published_pkey TO outbox_published_legacy_pkey;
    ALTER INDEX onceflow.outbox_published_published_at RENAME TO outbox_published_legacy_published_at;
    ALTER INDEX IF EXISTS onceflow.outbox_published_last_id RENAME TO outbox_published_legacy_last_id;
    ALTER INDEX IF EXISTS onceflow.outbox_published_id_span RENAME TO outbox_published_legacy_id_span;
    -- The index of step 3 becomes a constraint, so that the partitioned
    -- table's primary key adopts it.
    ALTER TABLE onceflow.outbox_published_legacy
        ADD CONSTRAINT outbox_published_legacy_batch_key UNIQUE USING INDEX outbox_published_legacy_batch_key;
    -- The identity's sequence goes with the identity: the partitioned
    -- table's identity gets a sequence of the same name, set where the old
    -- one stood.
    ALTER TABLE onceflow.outbox_published_legacy ALTER COLUMN batch DROP IDENTITY;

    CREATE TABLE onceflow.outbox_published (LIKE onceflow.outbox_published_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (last_id);
    ALTER TABLE onceflow.outbox_published DROP CONSTRAINT outbox_published_legacy_range;
    ALTER TABLE onceflow.outbox_published ALTER COLUMN batch ADD GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME onceflow.outbox_published_batch_seq);
    PERFORM setval('onceflow.outbox_published_batch_seq', v_last, v_called);
    ALTER TABLE onceflow.outbox_published ADD CONSTRAINT outbox_published_pkey PRIMARY KEY (batch, last_id);
    CREATE INDEX outbox_published_published_at ON onceflow.outbox_published (published_at);
    CREATE INDEX outbox_published_last_id ON onceflow.outbox_published (last_id);
    -- The relay's sweep finds the batches overlapping a range of ids
    -- through it (migration 017).
    CREATE INDEX outbox_published_id_span ON onceflow.outbox_published USING gist (int8range(first_id, last_id, '[]'));

    -- The old table's grants, table and column level, and the sequence's,
    -- carry over.
    FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.outbox_published_legacy'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON onceflow.outbox_published TO %s', r.privilege_type,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
    FOR r IN SELECT att.attname, a.grantee, a.privilege_type FROM pg_attribute att, aclexplode(att.attacl) a
              WHERE att.attrelid = 'onceflow.outbox_published_legacy'::regclass AND att.attacl IS NOT NULL AND NOT att.attisdropped
    LOOP
        EXECUTE format('GRANT %s (%I) ON onceflow.outbox_published TO %s', r.privilege_type, r.attname,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
    FOR r IN SELECT * FROM outbox_035_seq_acl LOOP
        EXECUTE format('GRANT %s ON SEQUENCE onceflow.outbox_published_batch_seq TO %s', r.privilege_type,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;

    EXECUTE format('ALTER TABLE onceflow.outbox_published ATTACH PARTITION onceflow.outbox_published_legacy FOR VALUES FROM (MINVALUE) TO (%s)', v_bound);
    CREATE TABLE onceflow.outbox_published_default PARTITION OF onceflow.outbox_published DEFAULT;
    -- The partitions of the outbox ranges above the bound, made since step 1.
    PERFORM onceflow.outbox_published_ensure_partitions();
END $$;
