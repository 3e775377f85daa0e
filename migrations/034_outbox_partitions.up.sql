---- tern: disable-tx ----
-- The outbox becomes a table partitioned by RANGE (id), so that retention
-- removes published rows a whole partition at a time (TRUNCATE, then DROP)
-- instead of deleting them row by row (docs/relay.md, "Storage layout:
-- the partitioned outbox").
--
--   onceflow.outbox_legacy     the table before this migration, ids below a
--                              bound chosen at step 1 (five partition widths
--                              above the highest id drawn then): new rows
--                              keep landing in it until the ids reach the
--                              bound.
--   onceflow.outbox_p_<from>   one partition per id range [from, from +
--                              width), width 1,000,000 ids (a call of
--                              outbox_ensure_partitions may give another for
--                              the ranges it makes); the relay's housekeeping
--                              keeps at least one unused partition ahead of
--                              the id sequence (outbox_ensure_partitions).
--   onceflow.outbox_default    ids no partition takes (the housekeeping fell
--                              behind): pruned row by row, as before.
-- onceflow.outbox_partitions lists the ranges (legacy included).
--
-- Keys. The partition key is id, so id stays the primary key, drawn by the
-- column's identity as before. (source, topic, seq) was already enforced by
-- the trigger outbox_check_seq (it locks the stream's counter and refuses a
-- seq that does not continue it); it keeps a plain index to probe.
--
-- event_id is unique through a narrow table that is not partitioned,
-- onceflow.outbox_keys (event_id, id), whose primary key is the constraint
-- outbox_event_id_key (the name the plain table's unique constraint had, so
-- a duplicate still fails with SQLSTATE 23505 on outbox_event_id_key). The
-- statement trigger outbox_keys_insert copies the event_id and id of every
-- row an INSERT into onceflow.outbox adds; outbox_keys_delete removes them
-- when the rows are deleted, and retention deletes the keys of a range it
-- truncates (outbox_expire_partition). A native unique index waits for an
-- inserter of the same key still in flight and sees keys committed after
-- the inserter's snapshot, so this holds under READ COMMITTED, REPEATABLE
-- READ and SERIALIZABLE alike, whatever partitions the rows' ids fall in.
-- The partitions have no index on event_id: a look-up by event_id goes
-- through the key table.
--
-- The rows from before the migration get their keys by a backfill (step
-- 2), not by a probe of the legacy partition at every insert: a probe
-- reads a snapshot, and a producer whose snapshot is older than a legacy
-- row's commit would not see that row (a REPEATABLE READ transaction that
-- took its snapshot before the swap and inserts after it), while the key
-- table's unique index sees every committed key. The backfill runs while
-- producers insert: the trigger exists before it starts (step 1), so every
-- row it cannot see has its key already, and it skips keys that are there
-- (ON CONFLICT DO NOTHING, which also waits for an inserter in flight). It
-- holds the advisory lock 0b0e/1, which outbox_keys_delete takes shared
-- before deleting keys, so a row deleted (pruned) while the backfill runs
-- does not leave a key behind. Once the swap commits, the legacy partition's
-- own unique constraint on event_id is dropped: every one of its event_ids
-- is in onceflow.outbox_keys, and a duplicate of a row landing in the
-- legacy partition then fails on outbox_event_id_key too, not on a
-- partition's constraint of another name.
--
-- The steps run in separate transactions (this file runs without an
-- enclosing one), each taking one short lock; producers and the relay keep
-- running:
--   1. the key table, the partitions' table, the functions, the key
--      triggers on the plain table (SHARE ROW EXCLUSIVE on onceflow.outbox,
--      which waits for the inserts in flight) and the check id < bound NOT
--      VALID (ACCESS EXCLUSIVE, a catalog update only);
--   2. the backfill of the keys of the rows already there: ACCESS SHARE on
--      onceflow.outbox, ROW EXCLUSIVE on onceflow.outbox_keys (reads and
--      writes go on; a prune's delete of rows waits for it to commit):
--      5-6 s per 1M rows, measured;
--   3. VALIDATE the check: SHARE UPDATE EXCLUSIVE (a scan; reads and
--      writes go on);
--   4. CREATE INDEX CONCURRENTLY of the plain index on (source, topic,
--      seq) the partitioned table's index adopts: SHARE UPDATE EXCLUSIVE
--      (writes go on);
--   5. last, one transaction renames the table to onceflow.outbox_legacy,
--      creates the partitioned onceflow.outbox with the same columns,
--      identity, checks, grants, indexes and triggers, attaches the old
--      table as the partition of the ids below the bound (the validated
--      check spares the scan, the existing indexes become the partition's),
--      drops its unique constraint on event_id, gives the key table's
--      primary key the name outbox_event_id_key, and creates the default
--      partition and the first range above the bound: ACCESS EXCLUSIVE on
--      the old table for catalog work only. Until it commits, every step
--      may be run again.

SET lock_timeout = '10s';

-- Step 1.

-- The key table. Its primary key is named outbox_keys_pkey until the swap
-- (the plain table's unique index holds the name outbox_event_id_key until
-- then). The index on id serves retention's delete of a range's keys.
-- event_id is compared bytewise (COLLATE "C"): equality is the same as
-- under the database's collation (a deterministic one), and the index
-- compares without the locale's string collation.
CREATE TABLE IF NOT EXISTS onceflow.outbox_keys (
    event_id text COLLATE "C" NOT NULL,
    id       bigint NOT NULL,
    CONSTRAINT outbox_keys_pkey PRIMARY KEY (event_id)
);
CREATE INDEX IF NOT EXISTS outbox_keys_id ON onceflow.outbox_keys (id);
-- Whoever may read onceflow.outbox's event_id may read the key table's:
-- onceflow.enqueue and enqueue_batch, which run with the caller's rights,
-- look a given event_id up there.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT a.grantee FROM pg_attribute att, aclexplode(att.attacl) a
              WHERE att.attrelid = 'onceflow.outbox'::regclass AND att.attname = 'event_id' AND att.attacl IS NOT NULL
                AND a.privilege_type = 'SELECT'
             UNION
             SELECT a.grantee FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.outbox'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
    LOOP
        IF r.grantee = 0 THEN
            GRANT SELECT (event_id) ON onceflow.outbox_keys TO PUBLIC;
        ELSE
            EXECUTE format('GRANT SELECT (event_id) ON onceflow.outbox_keys TO %s', r.grantee::regrole);
        END IF;
    END LOOP;
END $$;

-- The ranges of the outbox's partitions. truncated_at: retention emptied
-- the partition, which a later pass drops.
CREATE TABLE IF NOT EXISTS onceflow.outbox_partitions (
    from_id      bigint      PRIMARY KEY,
    to_id        bigint      NOT NULL,
    relname      name        NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    truncated_at timestamptz,
    CONSTRAINT outbox_partitions_range CHECK (to_id > from_id)
);

-- The keys of an INSERT's rows (see the top of this file). Producers hold
-- no privilege on onceflow.outbox_keys: the function runs with its
-- owner's rights.
CREATE OR REPLACE FUNCTION onceflow.outbox_keys_insert()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    INSERT INTO onceflow.outbox_keys (event_id, id) SELECT n.event_id, n.id FROM outbox_new n;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_keys_insert() FROM PUBLIC;

-- The keys of a DELETE's rows (the row-by-row prune, -delete-on-publish):
-- the event_ids are free again. The shared advisory lock waits for the
-- backfill of step 2, if one runs, to commit, so that this statement sees
-- the keys it added.
CREATE OR REPLACE FUNCTION onceflow.outbox_keys_delete()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(x'0b0e'::integer, 1);
    DELETE FROM onceflow.outbox_keys k USING outbox_old o WHERE k.event_id = o.event_id COLLATE "C" AND k.id = o.id;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_keys_delete() FROM PUBLIC;

-- A TRUNCATE of the whole outbox empties the key table too.
CREATE OR REPLACE FUNCTION onceflow.outbox_keys_truncate()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    TRUNCATE onceflow.outbox_keys;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_keys_truncate() FROM PUBLIC;

-- outbox_assign_seq (migration 029), with two changes:
--  - on the partitioned table a redrawn id must stay in the partition the
--    row was routed to (PostgreSQL refuses to move a row in a BEFORE
--    trigger); when it would not, the statement fails with a serialization
--    failure, which the producer retries. It happens only when the id is
--    drawn again (an INSERT naming no seq in a transaction that had no xid
--    yet, or a concurrent producer of the stream drew a later id and
--    committed first) and the new id is in the next range: at a range's
--    last id, about once per 1M such inserts. Enqueue, onceflow.enqueue
--    and the batch paths take the xid before the id is drawn;
--  - the look-up of the stream's last row asks only whether it has an id
--    at or above the new row's (the only case that matters: the id is
--    drawn again), so that PostgreSQL skips every partition below the new
--    row's id instead of probing each one's index.
CREATE OR REPLACE FUNCTION onceflow.outbox_assign_seq()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    v_last   bigint;
    v_top    bigint;
    v_top_id bigint;
    v_why    text;
    v_id     bigint;
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
    IF NOT FOUND AND NEW.id IS NOT NULL THEN
        -- The row holding the counter's seq (gone once deleted), when its
        -- id is not below the new row's: then the id is drawn again, as
        -- onceflow.outbox_check_seq requires the stream's ids to rise.
        SELECT o.id INTO v_top_id FROM onceflow.outbox o
         WHERE o.source = NEW.source AND o.topic = NEW.topic AND o.seq = v_last AND o.id >= NEW.id;
    END IF;
    NEW.seq := greatest(v_last, v_top) + 1;
    -- An id drawn before the transaction had an xid (the identity draws it
    -- before this trigger runs) is drawn again, now that the counter's lock
    -- gave the transaction one: the relay's scan floor relies on every id
    -- being drawn by a transaction that already has its xid (migration
    -- 024).
    IF NEW.id IS NULL OR NEW.id <= v_top_id OR v_fresh THEN
        PERFORM pg_current_xact_id();
        v_id := nextval('onceflow.outbox_id_seq');
        -- The partition the new id belongs in: the attached range that
        -- holds it, else the default partition.
        IF TG_TABLE_NAME <> 'outbox'
           AND coalesce((SELECT p.relname FROM onceflow.outbox_partitions p
                          WHERE v_id >= p.from_id AND v_id < p.to_id
                            AND (p.relname = 'outbox_legacy' OR p.relname LIKE 'outbox\_p\_%')), 'outbox_default') <> TG_TABLE_NAME THEN
            RAISE EXCEPTION 'onceflow.outbox: the row''s id had to be drawn again and the new one, %, lies in another partition than %; run the transaction again', v_id, TG_TABLE_NAME
                USING ERRCODE = '40001';
        END IF;
        NEW.id := v_id;
    END IF;
    RETURN NEW;
END
$function$;

-- outbox_check_seq (migration 029), with one change: whether the row
-- holding the counter's seq has an id at or above the statement's first
-- row of the stream is asked with that bound on id, so that PostgreSQL
-- skips every partition below it instead of probing each one's index.
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
        IF r.lo <> v_last + 1 OR NOT r.in_order
           OR EXISTS (SELECT 1 FROM onceflow.outbox o
                       WHERE o.source = r.source AND o.topic = r.topic AND o.seq = v_last AND o.id >= r.first_id) THEN
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


-- onceflow.enqueue and onceflow.enqueue_batch (migration 015 and later),
-- with two changes: onceflow.enqueue takes its seq from
-- onceflow.next_seqs and names it in the insert, as enqueue_batch does
-- (whoever may call onceflow.enqueue may call next_seqs: granted after
-- the function); and their look-up of each given event_id before the insert
-- (for their own error message, SQLSTATE 23505) reads the key table's
-- primary key instead of onceflow.outbox, where it would probe every
-- partition per event (measured: enqueue_batch with event_ids at 0.58 of
-- the plain table's rate with 21 partitions). They run with the caller's
-- rights: every role that may read onceflow.outbox's event_id may read the
-- key table's (granted above).
CREATE OR REPLACE FUNCTION onceflow.enqueue(topic text, source text, event_type text, payload jsonb, event_id text DEFAULT NULL::text, headers jsonb DEFAULT '{}'::jsonb, key text DEFAULT NULL::text, traceparent text DEFAULT NULL::text, tracestate text DEFAULT NULL::text)
 RETURNS onceflow.enqueued
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_payload    bytea := convert_to(enqueue.payload::text, 'UTF8');
    v_bad        text;
    v_result     onceflow.enqueued;
    v_parent     text := nullif(enqueue.traceparent, '');
    v_state      text := nullif(enqueue.tracestate, '');
    v_headers    jsonb := enqueue.headers;
    v_members    int;
    v_keys       int;
    v_ok         boolean;
    v_seq        bigint;
BEGIN
    -- The checks of the previous version, unchanged.
    -- topic: what Kafka accepts as a topic name.
    IF enqueue.topic IS NULL OR enqueue.topic = '' THEN
        RAISE EXCEPTION 'onceflow.enqueue: topic is missing or empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(enqueue.topic) > 249 THEN
        RAISE EXCEPTION 'onceflow.enqueue: topic is % bytes, over Kafka''s limit of 249', octet_length(enqueue.topic)
            USING ERRCODE = '22023';
    END IF;
    IF enqueue.topic !~ '^[A-Za-z0-9._-]+$' OR enqueue.topic IN ('.', '..') THEN
        RAISE EXCEPTION 'onceflow.enqueue: topic % is not a legal Kafka topic name (ASCII letters, digits, ''.'', ''_'' and ''-''; not "." or "..")',
            quote_literal(enqueue.topic) USING ERRCODE = '22023';
    END IF;

    -- source, event_type, event_id: present, bounded, no line break or NUL.
    IF enqueue.source IS NULL OR enqueue.source = '' THEN
        RAISE EXCEPTION 'onceflow.enqueue: source is missing or empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(enqueue.source) > 512 THEN
        RAISE EXCEPTION 'onceflow.enqueue: source is over 512 bytes' USING ERRCODE = '22023';
    END IF;
    IF enqueue.event_type IS NULL OR enqueue.event_type = '' THEN
        RAISE EXCEPTION 'onceflow.enqueue: event_type is missing or empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(enqueue.event_type) > 256 THEN
        RAISE EXCEPTION 'onceflow.enqueue: event_type is over 256 bytes' USING ERRCODE = '22023';
    END IF;
    IF enqueue.event_id = '' OR octet_length(enqueue.event_id) > 512 THEN
        RAISE EXCEPTION 'onceflow.enqueue: event_id must be 1 to 512 bytes' USING ERRCODE = '22023';
    END IF;
    v_bad := CASE
        WHEN strpos(enqueue.source, chr(10)) > 0 OR strpos(enqueue.source, chr(13)) > 0 THEN 'source'
        WHEN strpos(enqueue.event_type, chr(10)) > 0 OR strpos(enqueue.event_type, chr(13)) > 0 THEN 'event_type'
        WHEN strpos(enqueue.event_id, chr(10)) > 0 OR strpos(enqueue.event_id, chr(13)) > 0 THEN 'event_id'
    END;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow.enqueue: % contains a control character (line break)', v_bad USING ERRCODE = '22023';
    END IF;

    -- payload and headers.
    IF enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'onceflow.enqueue: payload is missing' USING ERRCODE = '22023';
    END IF;
    IF octet_length(v_payload) > 1048576 THEN
        RAISE EXCEPTION 'onceflow.enqueue: payload is % bytes, over the limit of 1048576', octet_length(v_payload)
            USING ERRCODE = '22023';
    END IF;
    IF enqueue.headers IS NULL OR jsonb_typeof(enqueue.headers) <> 'object' THEN
        RAISE EXCEPTION 'onceflow.enqueue: headers must be a JSON object of strings' USING ERRCODE = '22023';
    END IF;
    v_bad := NULL;
    SELECT h.k INTO v_bad FROM jsonb_each(enqueue.headers) AS h(k, v)
     WHERE jsonb_typeof(h.v) <> 'string'
        OR h.k = ''
        OR lower(h.k) IN ('event-id', 'source', 'seq', 'event-type', 'content-type', 'traceparent', 'producer')
        OR octet_length(h.k) + octet_length(h.v #>> '{}') > 8192
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'onceflow.enqueue: headers: % is reserved, empty, too long or not a string', quote_literal(v_bad)
            USING ERRCODE = '22023';
    END IF;

    -- Trace context (docs/tracing.md): a W3C traceparent, and a tracestate
    -- (the parameter or the header "tracestate", not both) only with one.
    IF v_parent IS NOT NULL
       AND v_parent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[0-9a-zA-Z._-]*)?$' THEN
        RAISE EXCEPTION 'onceflow.enqueue: traceparent % is not a W3C traceparent', quote_literal(left(v_parent, 80))
            USING ERRCODE = '22023';
    END IF;
    IF v_headers ? 'tracestate' THEN
        IF v_state IS NOT NULL THEN
            RAISE EXCEPTION 'onceflow.enqueue: tracestate is given both as the parameter and in headers' USING ERRCODE = '22023';
        END IF;
        v_state := v_headers->>'tracestate';
        v_headers := v_headers - 'tracestate';
    END IF;
    IF v_state IS NOT NULL THEN
        IF v_parent IS NULL THEN
            RAISE EXCEPTION 'onceflow.enqueue: tracestate needs a traceparent' USING ERRCODE = '22023';
        END IF;
        IF octet_length(v_state) > 512 THEN
            RAISE EXCEPTION 'onceflow.enqueue: tracestate is % bytes, over the limit of 512', octet_length(v_state)
                USING ERRCODE = '22023';
        END IF;
        -- At most 32 comma-separated key=value members (empty ones skipped)
        -- with distinct keys; the key and value character sets of W3C.
        SELECT count(*), count(DISTINCT m.k),
               coalesce(bool_and(m.eq > 0
                   AND m.k ~ '^([a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})$'
                   AND m.v ~ '^[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]$'), true)
          INTO v_members, v_keys, v_ok
          FROM (SELECT strpos(e, '=') AS eq,
                       ltrim(split_part(e, '=', 1), E' \t') AS k,
                       rtrim(substr(e, strpos(e, '=') + 1), E' \t') AS v
                  FROM regexp_split_to_table(v_state, ',') AS e
                 WHERE e <> '') AS m;
        IF NOT v_ok OR v_members > 32 OR v_keys < v_members THEN
            RAISE EXCEPTION 'onceflow.enqueue: tracestate % is not a W3C tracestate', quote_literal(left(v_state, 80))
                USING ERRCODE = '22023';
        END IF;
        v_headers := v_headers || jsonb_build_object('tracestate', v_state);
    END IF;
    IF v_parent IS NOT NULL THEN
        v_headers := v_headers || jsonb_build_object('traceparent', v_parent);
    END IF;

    IF enqueue.event_id IS NOT NULL AND EXISTS (SELECT 1 FROM onceflow.outbox_keys k WHERE k.event_id = enqueue.event_id COLLATE "C") THEN
        RAISE EXCEPTION 'onceflow.enqueue: event_id % already exists', quote_literal(enqueue.event_id)
            USING ERRCODE = '23505';
    END IF;
    -- The seq: from the stream's counter, locked by onceflow.next_seqs as
    -- enqueue_batch does, and named in the insert, so that the row trigger
    -- outbox_assign_seq does not run (its look-up of the statement's
    -- earlier rows of the stream reads every partition; measured: 0.45 of
    -- the plain table's rate with 21 partitions). outbox_check_seq checks
    -- the seq and moves the counter, as for a batch.
    SELECT n.next_seq INTO STRICT v_seq FROM onceflow.next_seqs(ARRAY[enqueue.source], ARRAY[enqueue.topic]) AS n;
    -- The xid before the row's id is drawn (the relay's scan floor,
    -- migration 024; the counter's row lock took one already).
    PERFORM pg_current_xact_id();
    INSERT INTO onceflow.outbox AS o (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload)
    -- A generated id is a UUIDv7 (RFC 9562), like Go's and enqueue_batch's:
    -- 48 bits of Unix milliseconds, the version 7, then a version-4 UUID's
    -- random bits from its 13th hex digit on.
    VALUES (coalesce(enqueue.event_id,
                     (SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(gen_random_uuid()::text, 16)
                        FROM lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') AS h)),
            enqueue.topic, enqueue.source, v_seq,
            enqueue.event_type, 'application/json', convert_to(enqueue.key, 'UTF8'), v_headers, v_payload)
    RETURNING o.event_id, o.seq INTO v_result.event_id, v_result.seq;
    RETURN v_result;
END
$function$
;
-- onceflow.enqueue calls onceflow.next_seqs with the caller's rights:
-- every role that may call onceflow.enqueue may call next_seqs (migration
-- 015 granted it to those that may call enqueue_batch). Migration 034's
-- way down leaves these grants: next_seqs only locks the counters of the
-- sources the caller may enqueue to, which onceflow.enqueue did too.
DO $$
DECLARE
    v_owner oid := (SELECT p.proowner FROM pg_proc p WHERE p.oid = 'onceflow.next_seqs(text[], text[])'::regprocedure);
    v_acl   aclitem[] := (SELECT p.proacl FROM pg_proc p
                           WHERE p.oid = 'onceflow.enqueue(text, text, text, jsonb, text, jsonb, text, text, text)'::regprocedure);
    r       record;
BEGIN
    IF v_acl IS NULL THEN -- the default: PUBLIC may execute
        GRANT EXECUTE ON FUNCTION onceflow.next_seqs(text[], text[]) TO PUBLIC;
    END IF;
    FOR r IN SELECT a.grantee FROM aclexplode(v_acl) AS a
              WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> v_owner AND a.grantee <> a.grantor LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.next_seqs(text[], text[]) TO %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
END $$;
CREATE OR REPLACE FUNCTION onceflow.enqueue_batch(events jsonb)
 RETURNS TABLE(event_id text, seq bigint)
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_ord      bigint;
    v_reason   text;
    v_ms       text;
    v_idprefix text;
    a_ord      bigint[];
    a_eid      text[];
    a_topic    text[];
    a_source   text[];
    a_type     text[];
    a_key      bytea[];
    a_headers  jsonb[];
    a_payload  bytea[];
BEGIN
    IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'onceflow.enqueue_batch: events must be a JSON array of objects' USING ERRCODE = '22023';
    END IF;

    -- One walk over the array: each event's fields (f), then onceflow.enqueue's
    -- checks on them (x; the first failing check names the event), collected
    -- into arrays. OFFSET 0 keeps each level a subquery of its own, so that
    -- every field and every reason is computed once per event.
    SELECT (array_agg(x.ord ORDER BY x.ord) FILTER (WHERE x.reason IS NOT NULL))[1],
           (array_agg(x.reason ORDER BY x.ord) FILTER (WHERE x.reason IS NOT NULL))[1],
           array_agg(x.ord), array_agg(x.event_id), array_agg(x.topic), array_agg(x.source),
           array_agg(x.event_type), array_agg(x.record_key), array_agg(x.headers), array_agg(x.payload)
      INTO v_ord, v_reason, a_ord, a_eid, a_topic, a_source, a_type, a_key, a_headers, a_payload
      FROM (
        SELECT f.ord, f.event_id, f.topic, f.source, f.event_type, convert_to(f.key, 'UTF8') AS record_key,
               coalesce(f.headers, '{}'::jsonb) AS headers, f.payload,
               CASE
                WHEN f.typ <> 'object' THEN 'is not a JSON object'
                WHEN f.topic IS NULL OR f.topic = '' THEN 'topic is missing or empty'
                WHEN octet_length(f.topic) > 249 THEN format('topic is %s bytes, over Kafka''s limit of 249', octet_length(f.topic))
                WHEN f.topic !~ '^[A-Za-z0-9._-]+$' OR f.topic IN ('.', '..') THEN
                    format('topic %s is not a legal Kafka topic name (ASCII letters, digits, ''.'', ''_'' and ''-''; not "." or "..")', quote_literal(f.topic))
                WHEN f.source IS NULL OR f.source = '' THEN 'source is missing or empty'
                WHEN octet_length(f.source) > 512 THEN 'source is over 512 bytes'
                WHEN f.event_type IS NULL OR f.event_type = '' THEN 'event_type is missing or empty'
                WHEN octet_length(f.event_type) > 256 THEN 'event_type is over 256 bytes'
                WHEN f.event_id = '' OR octet_length(f.event_id) > 512 THEN 'event_id must be 1 to 512 bytes'
                WHEN strpos(f.source, chr(10)) > 0 OR strpos(f.source, chr(13)) > 0 THEN 'source contains a control character (line break)'
                WHEN strpos(f.event_type, chr(10)) > 0 OR strpos(f.event_type, chr(13)) > 0 THEN 'event_type contains a control character (line break)'
                WHEN strpos(f.event_id, chr(10)) > 0 OR strpos(f.event_id, chr(13)) > 0 THEN 'event_id contains a control character (line break)'
                -- f.payload is NULL only when the key is absent: a JSON null renders as 'null'.
                WHEN f.payload IS NULL THEN 'payload is missing'
                WHEN octet_length(f.payload) > 1048576 THEN
                    format('payload is %s bytes, over the limit of 1048576', octet_length(f.payload))
                -- f.headers is NULL only when the key is absent (a JSON null is not an object).
                WHEN f.headers IS NOT NULL AND jsonb_typeof(f.headers) <> 'object' THEN 'headers must be a JSON object of strings'
                WHEN f.headers IS NOT NULL AND EXISTS (
                    SELECT 1 FROM jsonb_each(f.headers) AS h(k, hv)
                     WHERE jsonb_typeof(h.hv) <> 'string'
                        OR h.k = ''
                        OR lower(h.k) IN ('event-id', 'source', 'seq', 'event-type', 'content-type', 'traceparent', 'producer')
                        OR octet_length(h.k) + octet_length(h.hv #>> '{}') > 8192) THEN
                    'headers: a key is reserved, empty, too long or not a string'
                WHEN f.key_type IS NOT NULL AND f.key_type NOT IN ('string', 'null') THEN 'key must be a string'
               END AS reason
          FROM (
            SELECT e.ord, jsonb_typeof(e.v) AS typ, e.v->>'event_id' AS event_id, e.v->>'topic' AS topic,
                   e.v->>'source' AS source, e.v->>'event_type' AS event_type, e.v->>'key' AS key,
                   jsonb_typeof(e.v->'key') AS key_type, e.v->'headers' AS headers,
                   convert_to((e.v->'payload')::text, 'UTF8') AS payload
              FROM jsonb_array_elements(events) WITH ORDINALITY AS e(v, ord)
            OFFSET 0
          ) f
        OFFSET 0
      ) x;
    IF v_ord IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow.enqueue_batch: event %: %', v_ord, v_reason USING ERRCODE = '22023';
    END IF;

    -- event_id: unique (the key table of migration 034).
    SELECT u.id INTO v_reason
      FROM unnest(a_eid) AS u(id)
     WHERE u.id IS NOT NULL
       AND EXISTS (SELECT 1 FROM onceflow.outbox_keys k WHERE k.event_id = u.id COLLATE "C")
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'onceflow.enqueue_batch: event_id % already exists', quote_literal(v_reason) USING ERRCODE = '23505';
    END IF;

    -- UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, the version 7, then
    -- the random bits of a version-4 UUID from its 13th hex digit on (its
    -- variant bits are v7's too).
    v_ms := lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0');
    v_idprefix := substr(v_ms, 1, 8) || '-' || substr(v_ms, 9, 4) || '-7';

    -- The streams' counters, locked in (source, topic) order by
    -- onceflow.next_seqs, give each stream's next seq; the events of a stream
    -- take the seqs that follow in their order in the array, and are inserted
    -- sorted by source, topic, then position, so that per stream id order is
    -- seq order (the trigger outbox_check_seq checks both).
    RETURN QUERY
    WITH m AS (
        SELECT coalesce(m.eid, v_idprefix || substr(gen_random_uuid()::text, 16)) AS eid, m.topic, m.source,
               m.event_type, m.record_key, m.headers, m.payload, m.ord,
               row_number() OVER (PARTITION BY m.source, m.topic ORDER BY m.ord) - 1 AS k
          FROM unnest(a_ord, a_eid, a_topic, a_source, a_type, a_key, a_headers, a_payload)
               AS m(ord, eid, topic, source, event_type, record_key, headers, payload)
    ), s AS (
        SELECT n.source, n.topic, n.next_seq
          FROM (SELECT array_agg(d.source) AS sources, array_agg(d.topic) AS topics
                  FROM (SELECT DISTINCT m.source, m.topic FROM m) d) a
         CROSS JOIN LATERAL onceflow.next_seqs(a.sources, a.topics) n
    ), ins AS (
        INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload)
        SELECT m.eid, m.topic, m.source, s.next_seq + m.k, m.event_type, 'application/json', m.record_key, m.headers, m.payload
          FROM m JOIN s ON s.source = m.source AND s.topic = m.topic
         ORDER BY m.source, m.topic, m.ord
    )
    SELECT m.eid, s.next_seq + m.k
      FROM m JOIN s ON s.source = m.source AND s.topic = m.topic
     ORDER BY m.ord;
END
$function$
;


-- Creates the partitions of the id ranges above the newest one until one
-- lies wholly above the ids drawn so far (at least one spare), each p_width
-- ids wide (NULL: the newest range's width, 1,000,000 above the legacy
-- partition); returns how many it made. Attaching a partition takes SHARE
-- UPDATE EXCLUSIVE on onceflow.outbox and ACCESS EXCLUSIVE on the default
-- partition, each waited for at most 100 ms: the caller tries again at its
-- next pass. A range the default partition already holds rows of is not
-- made (they stay there, pruned row by row); the next one is.
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

-- Retention of the partition of range [p_from, …): truncated when every id
-- of its range has been drawn, none of its rows is queued or set aside
-- unresolved, and every publish-log batch holding one of its ids was
-- published before now() - p_keep; the log rows of the batches whose ids
-- all lie in emptied ranges go with it (except the batch holding the
-- highest id ever published, which recovery reads). The conditions are
-- checked under the partition's ACCESS EXCLUSIVE lock (waited for at most
-- 100 ms: the caller retries), which a producer's insert into it holds
-- until it commits. The keys of the range's rows are deleted from
-- onceflow.outbox_keys. Returns the rows truncated, NULL when the partition
-- may not go yet.
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

-- Drops the truncated partition of range [p_from, …) (ACCESS EXCLUSIVE on
-- onceflow.outbox, waited for at most 100 ms: the caller retries, and a
-- partition left truncated is dropped by a later pass). Refused when rows
-- came back into it (a producer's insert that drew its id before the
-- truncation committed after it): retention truncates it again later.
CREATE OR REPLACE FUNCTION onceflow.outbox_drop_partition(p_from bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $fn$
DECLARE
    v_name name;
    v_rows boolean;
BEGIN
    SELECT x.relname INTO v_name FROM onceflow.outbox_partitions x
     WHERE x.from_id = p_from AND x.truncated_at IS NOT NULL AND x.relname NOT LIKE 'outbox\_default@%';
    IF v_name IS NULL THEN
        RAISE EXCEPTION 'onceflow.outbox_drop_partition: no truncated partition from %', p_from USING ERRCODE = '22023';
    END IF;
    LOCK TABLE onceflow.outbox IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM onceflow.%I)', v_name) INTO v_rows;
    IF v_rows THEN
        UPDATE onceflow.outbox_partitions x SET truncated_at = NULL WHERE x.from_id = p_from;
        RETURN;
    END IF;
    EXECUTE format('DROP TABLE onceflow.%I', v_name);
    -- The range stays listed (as dropped) while it is the lowest: the
    -- newest range's end is where the next partition starts.
    UPDATE onceflow.outbox_partitions x SET relname = 'outbox_dropped@' || x.from_id WHERE x.from_id = p_from;
END
$fn$;

REVOKE ALL ON FUNCTION onceflow.outbox_ensure_partitions(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.outbox_expire_partition(bigint, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION onceflow.outbox_drop_partition(bigint) FROM PUBLIC;

-- The bound of the legacy partition, five widths above the ids drawn so
-- far (the bound is fixed now, and the ids drawn until step 5 must stay
-- below it), the key triggers on the plain table, and the check, not yet
-- validated.
DO $$
DECLARE
    v_bound bigint;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.outbox'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM onceflow.outbox_partitions WHERE relname = 'outbox_legacy') THEN
        v_bound := (greatest(coalesce(pg_sequence_last_value('onceflow.outbox_id_seq'::regclass), 0),
                             coalesce((SELECT max(id) FROM onceflow.outbox), 0)) / 1000000 + 5) * 1000000;
        INSERT INTO onceflow.outbox_partitions (from_id, to_id, relname) VALUES (-9223372036854775808, v_bound, 'outbox_legacy');
    END IF;
    SELECT to_id INTO v_bound FROM onceflow.outbox_partitions WHERE relname = 'outbox_legacy';
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'onceflow.outbox'::regclass AND tgname = 'outbox_keys_insert') THEN
        CREATE TRIGGER outbox_keys_insert AFTER INSERT ON onceflow.outbox
            REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_keys_insert();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'onceflow.outbox'::regclass AND tgname = 'outbox_keys_delete') THEN
        CREATE TRIGGER outbox_keys_delete AFTER DELETE ON onceflow.outbox
            REFERENCING OLD TABLE AS outbox_old FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_keys_delete();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'onceflow.outbox'::regclass AND tgname = 'outbox_keys_truncate') THEN
        CREATE TRIGGER outbox_keys_truncate AFTER TRUNCATE ON onceflow.outbox
            FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_keys_truncate();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'onceflow.outbox'::regclass AND conname = 'outbox_legacy_id_range') THEN
        EXECUTE format('ALTER TABLE onceflow.outbox ADD CONSTRAINT outbox_legacy_id_range CHECK (id < %s) NOT VALID', v_bound);
    END IF;
END $$;

-- Step 2: the keys of the rows already there (see the top of this file).
-- The triggers above exist, committed, so every row this statement cannot
-- see has its key already.
DO $$
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.outbox'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(x'0b0e'::integer, 1);
    INSERT INTO onceflow.outbox_keys (event_id, id)
    SELECT o.event_id, o.id FROM onceflow.outbox o
    ON CONFLICT (event_id) DO NOTHING;
END $$;

-- Step 3.
ALTER TABLE onceflow.outbox VALIDATE CONSTRAINT outbox_legacy_id_range;

-- Step 4: an index left invalid by an interrupted run is built again.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('onceflow.outbox_legacy_stream') AND NOT indisvalid) THEN
        DROP INDEX onceflow.outbox_legacy_stream;
    END IF;
END $$;
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_legacy_stream ON onceflow.outbox (source, topic, seq);

-- Step 5: the swap, one transaction; a failure leaves the plain table, and
-- the file can be run again from the start.
DO $$
DECLARE
    r        record;
    v_last   bigint;
    v_called boolean;
    v_bound  bigint;
    v_notify "char";
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = 'onceflow.outbox'::regclass) <> 'r' THEN
        RETURN;
    END IF;
    LOCK TABLE onceflow.outbox IN ACCESS EXCLUSIVE MODE;
    SELECT to_id INTO STRICT v_bound FROM onceflow.outbox_partitions WHERE relname = 'outbox_legacy';
    SELECT s.last_value, s.is_called INTO v_last, v_called FROM onceflow.outbox_id_seq s;
    SELECT t.tgenabled INTO v_notify FROM pg_trigger t WHERE t.tgrelid = 'onceflow.outbox'::regclass AND t.tgname = 'outbox_notify';
    CREATE TEMPORARY TABLE outbox_034_seq_acl ON COMMIT DROP AS
        SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'onceflow.outbox_id_seq'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0;

    ALTER TABLE onceflow.outbox RENAME TO outbox_legacy;
    ALTER TABLE onceflow.outbox_legacy RENAME CONSTRAINT outbox_pkey TO outbox_legacy_pkey;
    -- The triggers move to the partitioned table (a partition may not have
    -- triggers with transition tables).
    DROP TRIGGER outbox_assign_seq ON onceflow.outbox_legacy;
    DROP TRIGGER outbox_check_seq ON onceflow.outbox_legacy;
    DROP TRIGGER outbox_keys_insert ON onceflow.outbox_legacy;
    DROP TRIGGER outbox_keys_delete ON onceflow.outbox_legacy;
    DROP TRIGGER outbox_keys_truncate ON onceflow.outbox_legacy;
    DROP TRIGGER outbox_guard ON onceflow.outbox_legacy;
    DROP TRIGGER outbox_pending_insert ON onceflow.outbox_legacy;
    DROP TRIGGER outbox_pending_delete ON onceflow.outbox_legacy;
    DROP TRIGGER outbox_pending_truncate ON onceflow.outbox_legacy;
    DROP TRIGGER outbox_notify ON onceflow.outbox_legacy;
    -- The identity's sequence goes with the identity: the partitioned
    -- table's identity gets a sequence of the same name, set where the old
    -- one stood.
    ALTER TABLE onceflow.outbox_legacy ALTER COLUMN id DROP IDENTITY;

    CREATE TABLE onceflow.outbox (LIKE onceflow.outbox_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (id);
    ALTER TABLE onceflow.outbox DROP CONSTRAINT outbox_legacy_id_range;
    ALTER TABLE onceflow.outbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (SEQUENCE NAME onceflow.outbox_id_seq CACHE 1);
    PERFORM setval('onceflow.outbox_id_seq', v_last, v_called);
    ALTER TABLE onceflow.outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);
    -- Not unique: onceflow.outbox_keys keeps event_id unique, and
    -- outbox_check_seq (source, topic, seq). The partitions have no index
    -- on event_id: a look-up by event_id goes through the key table's
    -- primary key (onceflow.outbox_keys, then the row by id). A second
    -- index on event_id in every partition cost the producers about 5 %
    -- (docs/relay.md, "Producer cost").
    CREATE INDEX outbox_stream ON onceflow.outbox (source, topic, seq);

    CREATE TRIGGER outbox_assign_seq BEFORE INSERT ON onceflow.outbox
        FOR EACH ROW WHEN (NEW.seq IS NULL) EXECUTE FUNCTION onceflow.outbox_assign_seq();
    CREATE TRIGGER outbox_check_seq AFTER INSERT ON onceflow.outbox
        REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_check_seq();
    CREATE TRIGGER outbox_keys_insert AFTER INSERT ON onceflow.outbox
        REFERENCING NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_keys_insert();
    CREATE TRIGGER outbox_keys_delete AFTER DELETE ON onceflow.outbox
        REFERENCING OLD TABLE AS outbox_old FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_keys_delete();
    CREATE TRIGGER outbox_keys_truncate AFTER TRUNCATE ON onceflow.outbox
        FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_keys_truncate();
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

    -- The old table's grants, table and column level, and the sequence's,
    -- carry over.
    FOR r IN SELECT a.grantee, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.outbox_legacy'::regclass AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT %s ON onceflow.outbox TO %s', r.privilege_type, r.grantee::regrole);
    END LOOP;
    FOR r IN SELECT att.attname, a.grantee, a.privilege_type FROM pg_attribute att, aclexplode(att.attacl) a
              WHERE att.attrelid = 'onceflow.outbox_legacy'::regclass AND att.attacl IS NOT NULL AND NOT att.attisdropped
                AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT %s (%I) ON onceflow.outbox TO %s', r.privilege_type, r.attname, r.grantee::regrole);
    END LOOP;
    FOR r IN SELECT * FROM outbox_034_seq_acl LOOP
        EXECUTE format('GRANT %s ON SEQUENCE onceflow.outbox_id_seq TO %s', r.privilege_type, r.grantee::regrole);
    END LOOP;

    EXECUTE format('ALTER TABLE onceflow.outbox ATTACH PARTITION onceflow.outbox_legacy FOR VALUES FROM (MINVALUE) TO (%s)', v_bound);
    -- The key table holds every event_id of the legacy partition (step 2
    -- and the trigger): its own unique constraint goes, so that a duplicate
    -- fails on outbox_event_id_key wherever the new row lands, and the key
    -- table's primary key takes that name.
    ALTER TABLE onceflow.outbox_legacy DROP CONSTRAINT outbox_event_id_key;
    ALTER TABLE onceflow.outbox_keys RENAME CONSTRAINT outbox_keys_pkey TO outbox_event_id_key;
    CREATE TABLE onceflow.outbox_default PARTITION OF onceflow.outbox DEFAULT;
    PERFORM onceflow.outbox_ensure_partitions();
END $$;
