-- Migration 033: a bucket the default partition already has rows of no
-- longer stops the next bucket from being made.
--
-- onceflow.inbox_ensure_buckets (migration 028) makes a lane's current and
-- next time buckets. When the current bucket cannot be attached because
-- the default partition holds rows of its range (rows inserted while the
-- bucket was missing: its attach waited out its lock timeout), the function
-- returned without making the next one, so the next range's first rows
-- could land in the default partition too, and with them the range after.
-- It now goes on to the next bucket. One CREATE OR REPLACE FUNCTION: no
-- table is locked.

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
            -- The default partition holds rows of this range: its rows
            -- stay there (probed and pruned row by row), and the next
            -- bucket is still made, so that the next range's rows do not
            -- follow them.
            CONTINUE;
        END;
        INSERT INTO onceflow.inbox_buckets (consumer, lane, from_at, to_at, relname) VALUES (p_consumer, p_lane, v_from, v_to, v_name);
    END LOOP;
    RETURN v_end;
END
$fn$;
