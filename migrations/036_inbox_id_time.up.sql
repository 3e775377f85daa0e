-- Migration 036: the dedup probe of an event whose id is a UUIDv7 reads
-- only the time buckets that can hold it.
--
-- The inbox's dedup probe looks a key up in every time bucket of every
-- lane of the consumer (one index descent per bucket: nine for a 720h
-- class), because a row's bucket is the time it was first applied
-- (event_at, the database's clock), which the key alone does not tell. A
-- UUIDv7 (RFC 9562: 48 bits of Unix milliseconds first), the id the
-- outbox generates, carries the time it was made. From this migration on,
-- a row of a lane other than legacy whose event id is a UUIDv7 is never
-- older than that time less one hour:
--
--     event_at >= the id's time - 1 hour
--
-- (the constraint inbox_id_time below). The consumer puts a row that would
-- break it — an id made more than an hour ahead of the database's clock: a
-- producer's clock ahead, or a forged id — into the legacy lane instead,
-- which every probe reads whole (and retention prunes row by row). So the
-- probe of such a key reads a lane's buckets from the id's time less one
-- hour on, and all of them when the bucket is older than the moment this
-- migration added the constraint (onceflow.inbox_id_time.since: rows
-- written before it were not held to it). Any id that is not a UUIDv7
-- (lower-case hex, version 7, variant 10) is probed in every bucket as
-- before. The Go consumer reads the time from the id with the same rule
-- (pkg/inbox/idtime.go); a test holds the two to it.
--
-- Locks: ADD CONSTRAINT ... NOT VALID takes ACCESS EXCLUSIVE on
-- onceflow.inbox and each partition for the catalog update only (no row is
-- read: the existing rows are not checked), so consumers' inserts wait for
-- the migration's transaction, a few milliseconds. Buckets made later copy
-- the constraint (CREATE TABLE ... LIKE ... INCLUDING CONSTRAINTS).

ALTER TABLE onceflow.inbox ADD CONSTRAINT inbox_id_time CHECK (
    lane = 'legacy'
    OR event_id !~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
    OR event_at >= 'epoch'::timestamptz
                   + ((('x' || substr(event_id, 1, 8) || substr(event_id, 10, 4))::bit(48)::bigint) / 1000) * interval '1 second'
                   + ((('x' || substr(event_id, 1, 8) || substr(event_id, 10, 4))::bit(48)::bigint) % 1000) * interval '1 millisecond'
                   - interval '1 hour'
) NOT VALID;
-- (Seconds and milliseconds apart: an interval times a number is computed
-- in floating point, exact for these two products up to the largest
-- 48-bit time, not for the milliseconds times a thousand microseconds.)

-- One row: when the constraint took effect. It is read after the constraint
-- holds its lock, so every row committed without it has an event_at before
-- since (its transaction began before the lock was granted).
CREATE TABLE onceflow.inbox_id_time (
    one   boolean     PRIMARY KEY DEFAULT true CHECK (one),
    since timestamptz NOT NULL
);
INSERT INTO onceflow.inbox_id_time (since) VALUES (clock_timestamp());
