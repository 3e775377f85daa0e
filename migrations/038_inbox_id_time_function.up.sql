-- Migration 038: the constraint inbox_id_time (migration 036) is checked by
-- a function, onceflow.inbox_id_time_holds, instead of an expression.
--
-- Same rule: a row of a lane other than legacy whose event id is a UUIDv7
-- (lower-case hex, version 7, variant 10) has event_at >= the id's time
-- less one hour. Two costs of the expression made every inbox write pay:
--
--   - PostgreSQL reads a CHECK constraint's stored expression and prepares
--     it once per statement and partition written. This one is 8 kB of
--     stored node tree: 23 us of an UPDATE of one row that took 45 us. The
--     sequence guard's park, un-park and late mark are such statements.
--     A call of a function is a few nodes.
--   - It tests the id against a regular expression first, 2.3 us per row
--     inserted; the time (0.5 us) comes after. The function compares the
--     id's 12 hex digits of time with the row's time written the same way
--     first (byte order in the C collation is numeric order for lower-case
--     hex of one length), which a UUIDv7 made before its row passes; only
--     an id that fails it is matched against the regular expression, and
--     one that matches is held to the exact comparison of migration 036.
--     The comparison of hex digits is used only for an event_at in
--     1970-2105: it takes the row's time in milliseconds from
--     date_part('epoch'), a double, within half a microsecond of the true
--     value while the seconds stay below 2^32, so its floor is exact (a
--     later time was off by one millisecond: the test of this migration
--     found it). Any other event_at goes the exact way.
--
-- Measured on PostgreSQL 15 (2 cores): an UPDATE of one inbox row 45 -> 24
-- us, the check of an inserted row 2.9 -> 0.7 us.
--
-- The function is PL/pgSQL, so never inlined, and has no SET search_path:
-- a SET clause costs 0.9 us per call, which would more than double the
-- check of an inserted row. Its body names the schema of every function,
-- operator, type and collation it uses instead, so it means the same
-- under any search_path (a restore by pg_dump runs with an empty one).
--
-- Locks: DROP CONSTRAINT and ADD CONSTRAINT ... NOT VALID take ACCESS
-- EXCLUSIVE on onceflow.inbox and each partition for the catalog update
-- only (no row is read), so consumers' writes wait for this migration's
-- transaction, a few milliseconds. The new constraint is NOT VALID, as the
-- old one was until `migrate -validate-id-time` ran: the rows written under
-- the old constraint hold the new one (the same rule), so
-- onceflow.inbox_id_time.since is left as it is and the probe reads what
-- it read before. `migrate -validate-id-time` marks the constraint valid
-- again (it reads every partition; nothing depends on it).

CREATE FUNCTION onceflow.inbox_id_time_holds(p_lane text, p_event_id text, p_event_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $fn$
BEGIN
    IF p_lane OPERATOR(pg_catalog.=) 'legacy' THEN
        RETURN true;
    END IF;
    IF p_event_at OPERATOR(pg_catalog.>=) '1970-01-01 00:00:00+00'::pg_catalog.timestamptz
       AND p_event_at OPERATOR(pg_catalog.<) '2106-01-01 00:00:00+00'::pg_catalog.timestamptz
       AND (pg_catalog.substr(p_event_id, 1, 8) OPERATOR(pg_catalog.||) pg_catalog.substr(p_event_id, 10, 4)) COLLATE pg_catalog."C"
           OPERATOR(pg_catalog.<=) pg_catalog.lpad(pg_catalog.to_hex(
               pg_catalog.floor(pg_catalog.date_part('epoch', p_event_at) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8
               OPERATOR(pg_catalog.+) 3600000), 12, '0') THEN
        RETURN true;
    END IF;
    IF p_event_id OPERATOR(pg_catalog.!~) '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' THEN
        RETURN true;
    END IF;
    -- (OPERATOR() forms all bind alike, left to right: the parentheses
    -- give the order.)
    RETURN p_event_at OPERATOR(pg_catalog.>=) (((('epoch'::pg_catalog.timestamptz
        OPERATOR(pg_catalog.+) (((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(p_event_id, 1, 8) OPERATOR(pg_catalog.||) pg_catalog.substr(p_event_id, 10, 4))::pg_catalog.bit(48)::pg_catalog.int8)
            OPERATOR(pg_catalog./) 1000) OPERATOR(pg_catalog.*) '1 second'::pg_catalog.interval))
        OPERATOR(pg_catalog.+) (((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(p_event_id, 1, 8) OPERATOR(pg_catalog.||) pg_catalog.substr(p_event_id, 10, 4))::pg_catalog.bit(48)::pg_catalog.int8)
            OPERATOR(pg_catalog.%) 1000) OPERATOR(pg_catalog.*) '1 millisecond'::pg_catalog.interval))
        OPERATOR(pg_catalog.-) '1 hour'::pg_catalog.interval));
END
$fn$;

ALTER TABLE onceflow.inbox DROP CONSTRAINT inbox_id_time;
ALTER TABLE onceflow.inbox ADD CONSTRAINT inbox_id_time
    CHECK (onceflow.inbox_id_time_holds(lane, event_id, event_at)) NOT VALID;

-- A CHECK's function runs with the rights of the role that writes the row,
-- and functions made by the migrating role are not executable by PUBLIC
-- (migration 018). The consumer's role gets EXECUTE from
-- deploy/sql/roles.sql, but its inbox writes would fail from this commit
-- until that script runs again: PUBLIC may run it. It reads nothing and
-- writes nothing; it compares its three arguments. (roles.sql takes
-- PUBLIC's grant away and grants the consumer's role.)
GRANT EXECUTE ON FUNCTION onceflow.inbox_id_time_holds(text, text, timestamptz) TO PUBLIC;
