---- tern: disable-tx ----
-- The inbox becomes a table partitioned by RANGE (lane, consumer, event_at),
-- so that retention removes whole partitions (TRUNCATE, DROP) instead of
-- deleting row by row (docs/consumer.md, "Storage layout").
--
--   lane      the retention lane of the row's event type: 'permanent' (one
--             partition per consumer, never removed), 'ttl-<seconds>s' (one
--             partition per consumer and time bucket), or 'legacy' (the rows
--             of the table before this migration, and rows retention kept
--             out of an expired bucket: pruned row by row, as before);
--   event_at  when the row was inserted (the database's clock): it picks the
--             time bucket. Rows of the old table have '-infinity'.
--
-- The dedup key stays (consumer, event_id): the primary key must hold the
-- partition key, so the consumer probes every partition of its consumer
-- name for a batch's ids before inserting (partition-pruned by lane and
-- consumer) and serializes inserts of one id with a transaction advisory
-- lock (pkg/inbox/queries.go).
--
-- The steps run in separate transactions (this file runs without an
-- enclosing one), each taking one short lock; the application keeps running:
--   1. new columns with constant defaults and a NOT VALID check: ACCESS
--      EXCLUSIVE on onceflow.inbox for a catalog update (no rewrite);
--   2. VALIDATE the check: SHARE UPDATE EXCLUSIVE (a scan; reads and writes
--      go on);
--   3. CREATE UNIQUE INDEX CONCURRENTLY of the new key, and CREATE INDEX
--      CONCURRENTLY of the rows retention keeps (not processed, or late):
--      SHARE UPDATE EXCLUSIVE (writes go on);
--   4. one transaction renames the table to onceflow.inbox_legacy, creates
--      the partitioned onceflow.inbox with the same columns, grants and
--      indexes, and attaches the old table as the partition of lane
--      'legacy' (the validated check spares the scan, the existing indexes
--      become the partition's): ACCESS EXCLUSIVE on the old table for
--      catalog work only;
--   5. tables and functions of the lanes and buckets: no lock on the inbox.
-- A consumer built before this migration fails its insert in the meantime
-- ("no unique or exclusion constraint matching the ON CONFLICT
-- specification") and retries it: upgrade the consumers right after
-- (docs/consumer.md, "Rollout").

SET lock_timeout = '10s';

DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.inbox'::regclass) = 'r' THEN
        ALTER TABLE onceflow.inbox
            ADD COLUMN IF NOT EXISTS lane text NOT NULL DEFAULT 'legacy',
            ADD COLUMN IF NOT EXISTS event_at timestamptz NOT NULL DEFAULT '-infinity';
        IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'onceflow.inbox'::regclass AND conname = 'inbox_legacy_lane') THEN
            ALTER TABLE onceflow.inbox ADD CONSTRAINT inbox_legacy_lane CHECK (lane = 'legacy') NOT VALID;
        END IF;
    END IF;
END $$;

DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.inbox'::regclass) = 'r' THEN
        ALTER TABLE onceflow.inbox VALIDATE CONSTRAINT inbox_legacy_lane;
    END IF;
END $$;

CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS inbox_legacy_key ON onceflow.inbox (consumer, event_id, lane, event_at);
-- The rows retention keeps out of an expired bucket (few): found without
-- scanning the bucket while it is locked.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_legacy_kept ON onceflow.inbox (consumer) WHERE status <> 'processed' OR late;

DO $$
DECLARE
    r record;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.inbox'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    -- The concurrently built index becomes a constraint, which the parent's
    -- unique constraint takes as the partition's (else ATTACH builds one).
    ALTER TABLE onceflow.inbox ADD CONSTRAINT inbox_legacy_key UNIQUE USING INDEX inbox_legacy_key;
    ALTER TABLE onceflow.inbox RENAME TO inbox_legacy;
    ALTER TABLE onceflow.inbox_legacy RENAME CONSTRAINT inbox_pkey TO inbox_legacy_pkey;
    ALTER INDEX onceflow.inbox_attention RENAME TO inbox_legacy_attention;
    ALTER INDEX onceflow.inbox_received_at RENAME TO inbox_legacy_received_at;
    ALTER INDEX onceflow.inbox_parked RENAME TO inbox_legacy_parked;

    CREATE TABLE onceflow.inbox (
        consumer        text        NOT NULL,
        event_id        text        NOT NULL,
        source          text        NOT NULL,
        seq             bigint,
        event_type      text        NOT NULL,
        topic           text        NOT NULL,
        kafka_partition integer     NOT NULL,
        kafka_offset    bigint      NOT NULL,
        status          text        NOT NULL,
        late            boolean     NOT NULL DEFAULT false,
        attempts        integer     NOT NULL DEFAULT 0,
        last_error      text,
        headers         jsonb,
        payload         bytea,
        received_at     timestamptz NOT NULL DEFAULT now(),
        processed_at    timestamptz,
        producer        text        NOT NULL DEFAULT '',
        -- A row written without a lane (an operator's insert, a test) lands
        -- in the legacy partition, which is pruned row by row.
        lane            text        NOT NULL DEFAULT 'legacy',
        event_at        timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT inbox_status_check CHECK (status IN ('processed', 'parked', 'dead', 'held')),
        -- Not a primary key: the legacy partition keeps its own,
        -- (consumer, event_id).
        CONSTRAINT inbox_key UNIQUE (consumer, event_id, lane, event_at)
    ) PARTITION BY RANGE (lane, consumer, event_at);
    CREATE INDEX inbox_attention ON onceflow.inbox (consumer, status, received_at) WHERE status IN ('dead', 'held');
    CREATE INDEX inbox_received_at ON onceflow.inbox (received_at);
    CREATE INDEX inbox_parked ON onceflow.inbox (consumer, source, seq) WHERE status = 'parked';
    CREATE INDEX inbox_kept ON onceflow.inbox (consumer) WHERE status <> 'processed' OR late;

    -- The old table's grants, table and column level, carry over.
    FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.inbox_legacy'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT %s ON onceflow.inbox TO %s', r.privilege_type, r.grantee::regrole);
    END LOOP;
    FOR r IN SELECT att.attname, a.grantee, a.privilege_type FROM pg_attribute att, aclexplode(att.attacl) a
              WHERE att.attrelid = 'onceflow.inbox_legacy'::regclass AND att.attacl IS NOT NULL AND NOT att.attisdropped
                AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT %s (%I) ON onceflow.inbox TO %s', r.privilege_type, r.attname, r.grantee::regrole);
    END LOOP;

    ALTER TABLE onceflow.inbox ATTACH PARTITION onceflow.inbox_legacy
        FOR VALUES FROM ('legacy', MINVALUE, MINVALUE) TO ('legacy', MAXVALUE, MAXVALUE);
    ALTER TABLE onceflow.inbox_legacy ALTER COLUMN event_at SET DEFAULT now();

    -- Rows no bucket takes (a bucket not created in time): pruned row by row.
    CREATE TABLE onceflow.inbox_default PARTITION OF onceflow.inbox DEFAULT;
    FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.inbox_legacy'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
                AND a.privilege_type IN ('SELECT', 'DELETE')
    LOOP
        EXECUTE format('GRANT %s ON onceflow.inbox_default TO %s', r.privilege_type, r.grantee::regrole);
    END LOOP;
END $$;

-- The lane of an event type, per consumer, written once (by inbox_lane):
-- a later change of the retention policy never moves a type's rows.
CREATE TABLE IF NOT EXISTS onceflow.inbox_lanes (
    consumer    text        NOT NULL,
    event_type  text        NOT NULL,
    lane        text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_type)
);

-- The retention classes a consumer's pruner published (pkg/retention, at
-- each pass): a new event type's lane is its first matching class's.
-- pattern is the class's glob as an anchored regular expression; keep_s is
-- NULL for permanent.
CREATE TABLE IF NOT EXISTS onceflow.inbox_classes (
    consumer     text        NOT NULL,
    ord          integer     NOT NULL,
    glob         text        NOT NULL,
    pattern      text        NOT NULL,
    keep_s       bigint,
    published_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, ord)
);

-- The time-bucket partitions (and each consumer's permanent partition).
CREATE TABLE IF NOT EXISTS onceflow.inbox_buckets (
    consumer     text        NOT NULL,
    lane         text        NOT NULL,
    from_at      timestamptz NOT NULL,
    to_at        timestamptz NOT NULL,
    relname      name        NOT NULL UNIQUE,
    truncated_at timestamptz,
    PRIMARY KEY (consumer, lane, from_at)
);

-- The width of a TTL lane's buckets: an eighth of the TTL in whole hours,
-- at least one hour (about nine buckets live per lane; a row is kept at
-- most one width longer than its TTL).
CREATE OR REPLACE FUNCTION onceflow.inbox_lane_width(p_lane text)
RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT greatest(3600, ceil(substring(p_lane FROM '^ttl-([0-9]+)s$')::numeric / 8 / 3600)::bigint * 3600)
$fn$;

-- Creates the partition of a lane's bucket holding p_at (and of the next
-- one) when missing, and returns the end of p_at's bucket ('infinity' for
-- the permanent lane, for 'legacy' nothing is made). A bucket whose range
-- the default partition already has rows of is not made (its rows stay
-- in the default partition); the caller may try again later. Attaching a
-- partition takes SHARE UPDATE EXCLUSIVE on onceflow.inbox and ACCESS
-- EXCLUSIVE on the default partition (which every dedup probe reads), each
-- waited for at most 100 ms: the caller tries again a minute later (the
-- next bucket is made a whole bucket ahead).
CREATE OR REPLACE FUNCTION onceflow.inbox_ensure_buckets(p_consumer text, p_lane text, p_at timestamptz DEFAULT now())
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
    IF p_lane = 'legacy' THEN
        RETURN 'infinity';
    END IF;
    IF p_lane <> 'permanent' AND p_lane !~ '^ttl-[0-9]+s$' THEN
        RAISE EXCEPTION 'onceflow.inbox_ensure_buckets: unknown lane %', p_lane USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(x'0e1c'::integer, hashtext(p_consumer || E'\n' || p_lane));
    FOR i IN 0..1 LOOP
        IF p_lane = 'permanent' THEN
            EXIT WHEN i > 0;
            v_from := '-infinity';
            v_to := 'infinity';
        ELSE
            v_w := onceflow.inbox_lane_width(p_lane);
            v_from := to_timestamp((floor(extract(epoch FROM p_at) / v_w) + i) * v_w);
            v_to := v_from + make_interval(secs => v_w);
        END IF;
        IF i = 0 THEN
            v_end := v_to;
        END IF;
        CONTINUE WHEN EXISTS (SELECT 1 FROM onceflow.inbox_buckets b
                               WHERE b.consumer = p_consumer AND b.lane = p_lane AND b.from_at = v_from);
        v_name := 'inbox_b_' || left(md5(p_consumer || E'\n' || p_lane || E'\n' || v_from::text), 20);
        BEGIN
            EXECUTE format('CREATE TABLE onceflow.%I (LIKE onceflow.inbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', v_name);
            IF p_lane = 'permanent' THEN
                EXECUTE format('ALTER TABLE onceflow.inbox ATTACH PARTITION onceflow.%I FOR VALUES FROM (%L, %L, MINVALUE) TO (%L, %L, MAXVALUE)',
                               v_name, p_lane, p_consumer, p_lane, p_consumer);
            ELSE
                EXECUTE format('ALTER TABLE onceflow.inbox ATTACH PARTITION onceflow.%I FOR VALUES FROM (%L, %L, %L) TO (%L, %L, %L)',
                               v_name, p_lane, p_consumer, v_from, p_lane, p_consumer, v_to);
            END IF;
        EXCEPTION WHEN check_violation THEN
            -- The default partition holds rows of this range.
            RETURN v_end;
        END;
        INSERT INTO onceflow.inbox_buckets (consumer, lane, from_at, to_at, relname) VALUES (p_consumer, p_lane, v_from, v_to, v_name);
    END LOOP;
    RETURN v_end;
END
$fn$;

-- The lane of consumer p_consumer's event type p_type: the one recorded,
-- else the lane of the first published class matching it (recorded now,
-- for good; a type no class matches is permanent), else, when the
-- consumer's pruner never published a policy, 'legacy' (not recorded:
-- the type gets its lane once a policy is published). Makes the lane's
-- current buckets.
CREATE OR REPLACE FUNCTION onceflow.inbox_lane(p_consumer text, p_type text)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_lane text;
    v_keep bigint;
    v_found boolean := false;
BEGIN
    SELECT l.lane INTO v_lane FROM onceflow.inbox_lanes l WHERE l.consumer = p_consumer AND l.event_type = p_type;
    IF v_lane IS NULL THEN
        IF NOT EXISTS (SELECT 1 FROM onceflow.inbox_classes c WHERE c.consumer = p_consumer) THEN
            RETURN 'legacy';
        END IF;
        SELECT c.keep_s, true INTO v_keep, v_found FROM onceflow.inbox_classes c
         WHERE c.consumer = p_consumer AND p_type ~ c.pattern ORDER BY c.ord LIMIT 1;
        v_lane := CASE WHEN v_found AND v_keep IS NOT NULL THEN 'ttl-' || v_keep || 's' ELSE 'permanent' END;
        INSERT INTO onceflow.inbox_lanes (consumer, event_type, lane) VALUES (p_consumer, p_type, v_lane)
        ON CONFLICT DO NOTHING;
        SELECT l.lane INTO v_lane FROM onceflow.inbox_lanes l WHERE l.consumer = p_consumer AND l.event_type = p_type;
    END IF;
    RETURN v_lane;
END
$fn$;

-- Retention's first step on an expired bucket: the rows it must keep
-- (parked, held, dead, late) move to the legacy partition, where the dedup
-- probe still finds them, and the bucket is truncated. ACCESS EXCLUSIVE on
-- the bucket only, waited for at most 100 ms (the caller retries).
CREATE OR REPLACE FUNCTION onceflow.inbox_expire_bucket(p_consumer text, p_lane text, p_from timestamptz)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $fn$
DECLARE
    v_name name;
    v_moved bigint;
BEGIN
    SELECT b.relname INTO v_name FROM onceflow.inbox_buckets b
     WHERE b.consumer = p_consumer AND b.lane = p_lane AND b.from_at = p_from AND b.lane LIKE 'ttl-%';
    IF v_name IS NULL THEN
        RAISE EXCEPTION 'onceflow.inbox_expire_bucket: no bucket % % %', p_consumer, p_lane, p_from USING ERRCODE = '22023';
    END IF;
    EXECUTE format('LOCK TABLE onceflow.%I IN ACCESS EXCLUSIVE MODE', v_name);
    EXECUTE format($q$
        INSERT INTO onceflow.inbox_legacy (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset,
            status, late, attempts, last_error, headers, payload, received_at, processed_at, producer, lane, event_at)
        SELECT consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset,
            status, late, attempts, last_error, headers, payload, received_at, processed_at, producer, 'legacy', event_at
        FROM onceflow.%I WHERE consumer = %L AND (status <> 'processed' OR late)$q$, v_name, p_consumer);
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    EXECUTE format('TRUNCATE onceflow.%I', v_name);
    UPDATE onceflow.inbox_buckets SET truncated_at = now()
     WHERE consumer = p_consumer AND lane = p_lane AND from_at = p_from;
    RETURN v_moved;
END
$fn$;

-- Retention's second step: the truncated bucket's partition is dropped
-- (ACCESS EXCLUSIVE on onceflow.inbox, waited for at most 100 ms; the
-- caller retries, and a bucket left truncated is dropped by a later pass).
CREATE OR REPLACE FUNCTION onceflow.inbox_drop_bucket(p_consumer text, p_lane text, p_from timestamptz)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $fn$
DECLARE
    v_name name;
    v_rows boolean;
BEGIN
    SELECT b.relname INTO v_name FROM onceflow.inbox_buckets b
     WHERE b.consumer = p_consumer AND b.lane = p_lane AND b.from_at = p_from AND b.truncated_at IS NOT NULL;
    IF v_name IS NULL THEN
        RAISE EXCEPTION 'onceflow.inbox_drop_bucket: no truncated bucket % % %', p_consumer, p_lane, p_from USING ERRCODE = '22023';
    END IF;
    LOCK TABLE onceflow.inbox IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM onceflow.%I)', v_name) INTO v_rows;
    IF v_rows THEN
        RAISE EXCEPTION 'onceflow.inbox_drop_bucket: bucket % has rows again', v_name USING ERRCODE = '55000';
    END IF;
    EXECUTE format('DROP TABLE onceflow.%I', v_name);
    DELETE FROM onceflow.inbox_buckets WHERE consumer = p_consumer AND lane = p_lane AND from_at = p_from;
END
$fn$;

-- The consumer's role runs these with the owner's rights (deploy/sql/roles.sql).
REVOKE ALL ON FUNCTION onceflow.inbox_ensure_buckets(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.inbox_lane(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.inbox_expire_bucket(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.inbox_drop_bucket(text, text, timestamptz) FROM PUBLIC;
