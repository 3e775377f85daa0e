-- Migration 037: sealed inbox buckets and the filters of their keys.
--
-- The dedup probe of an id that carries no time (anything but a lower-case
-- UUIDv7: a producer's own ids) must look in every time bucket of the
-- consumer's lanes, one index descent each, because a row's bucket is the
-- time it was applied. Once a bucket's time is past, no new row belongs in
-- it: retention's pass then seals it (a trigger refuses any row inserted
-- into it from then on) and stores a filter of the ids it holds that are
-- not UUIDv7s, which the consumer loads. The probe of such an id skips
-- every sealed bucket whose filter says the id is not there (a Bloom
-- filter: "not there" is always right, "maybe" is checked in the bucket).
--
-- Why a trigger: a row goes to the bucket of its transaction's now(), so a
-- transaction that began before a bucket's end may still write to it
-- later. Sealing waits for the writers that hold the bucket (CREATE
-- TRIGGER takes SHARE ROW EXCLUSIVE, which conflicts with their ROW
-- EXCLUSIVE), so the filter, read after the seal commits, sees every row
-- written before it; any later insert, however old its transaction, fails
-- with SQLSTATE 40001, which the consumer retries in a new transaction
-- (whose now() falls in a later bucket). A trigger, not a check in the
-- consumer's statement, so that an older consumer binary is held to it
-- too.
--
-- Locks: the migration adds a column to onceflow.inbox_buckets (ACCESS
-- EXCLUSIVE on that small table, a catalog change) and creates a table and
-- functions; nothing on onceflow.inbox.

ALTER TABLE onceflow.inbox_buckets ADD COLUMN sealed_at timestamptz;

CREATE TABLE onceflow.inbox_filters (
    consumer text        NOT NULL,
    lane     text        NOT NULL,
    from_at  timestamptz NOT NULL,
    keys     bigint      NOT NULL,
    filter   bytea       NOT NULL,
    built_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, lane, from_at),
    FOREIGN KEY (consumer, lane, from_at) REFERENCES onceflow.inbox_buckets (consumer, lane, from_at) ON DELETE CASCADE
);

-- The trigger of a sealed bucket: every insert fails, retryably.
CREATE OR REPLACE FUNCTION onceflow.inbox_refuse_sealed()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RAISE EXCEPTION 'onceflow: inbox bucket % is sealed (its time is past), so the row of event % cannot go there: retry the transaction',
        TG_TABLE_NAME, NEW.event_id
        USING ERRCODE = '40001';
END
$fn$;

-- Seals a time bucket of consumer p_consumer's lane p_lane that ended at
-- least five minutes ago (an error otherwise): from the commit on, no row
-- can be inserted into it. Returns true when it was sealed now, false when
-- it was already. SHARE ROW EXCLUSIVE on the bucket only, waited for at
-- most 100 ms (the caller retries on a later pass).
CREATE OR REPLACE FUNCTION onceflow.inbox_seal_bucket(p_consumer text, p_lane text, p_from timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $fn$
DECLARE
    v_name   name;
    v_to     timestamptz;
    v_sealed timestamptz;
BEGIN
    SELECT b.relname, b.to_at, b.sealed_at INTO v_name, v_to, v_sealed FROM onceflow.inbox_buckets b
     WHERE b.consumer = p_consumer AND b.lane = p_lane AND b.from_at = p_from AND b.lane LIKE 'ttl-%'
       FOR UPDATE;
    IF v_name IS NULL THEN
        RAISE EXCEPTION 'onceflow.inbox_seal_bucket: no bucket % % %', p_consumer, p_lane, p_from USING ERRCODE = '22023';
    END IF;
    IF v_sealed IS NOT NULL THEN
        RETURN false;
    END IF;
    IF v_to > now() - interval '5 minutes' THEN
        RAISE EXCEPTION 'onceflow.inbox_seal_bucket: bucket % % % ends at %, less than 5 minutes ago', p_consumer, p_lane, p_from, v_to
            USING ERRCODE = '22023';
    END IF;
    EXECUTE format('CREATE TRIGGER inbox_sealed BEFORE INSERT ON onceflow.%I FOR EACH ROW EXECUTE FUNCTION onceflow.inbox_refuse_sealed()', v_name);
    UPDATE onceflow.inbox_buckets SET sealed_at = now()
     WHERE consumer = p_consumer AND lane = p_lane AND from_at = p_from;
    RETURN true;
END
$fn$;

-- Stores the filter of a sealed bucket's keys (built by the caller from
-- the rows it read after the seal committed). Refused for a bucket that
-- is not sealed; a second filter of the same bucket is ignored.
CREATE OR REPLACE FUNCTION onceflow.inbox_put_filter(p_consumer text, p_lane text, p_from timestamptz, p_keys bigint, p_filter bytea)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM onceflow.inbox_buckets b
                    WHERE b.consumer = p_consumer AND b.lane = p_lane AND b.from_at = p_from AND b.sealed_at IS NOT NULL) THEN
        RAISE EXCEPTION 'onceflow.inbox_put_filter: bucket % % % is not sealed', p_consumer, p_lane, p_from USING ERRCODE = '55000';
    END IF;
    INSERT INTO onceflow.inbox_filters (consumer, lane, from_at, keys, filter)
    VALUES (p_consumer, p_lane, p_from, p_keys, p_filter)
    ON CONFLICT DO NOTHING;
END
$fn$;

REVOKE ALL ON FUNCTION onceflow.inbox_seal_bucket(text, text, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.inbox_put_filter(text, text, timestamptz, bigint, bytea) FROM PUBLIC;
