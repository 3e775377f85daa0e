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
-- and triggers. Then the seq triggers' functions of migration 029 and
-- onceflow.enqueue and enqueue_batch as migration 033 left them come back,
-- and the objects of 034 go.

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

-- onceflow.enqueue and onceflow.enqueue_batch as migration 033 left them.
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

    IF enqueue.event_id IS NOT NULL AND EXISTS (SELECT 1 FROM onceflow.outbox o WHERE o.event_id = enqueue.event_id) THEN
        RAISE EXCEPTION 'onceflow.enqueue: event_id % already exists', quote_literal(enqueue.event_id)
            USING ERRCODE = '23505';
    END IF;
    -- The xid before the row's id is drawn (the relay's scan floor,
    -- migration 024), so that the trigger keeps the id.
    PERFORM pg_current_xact_id();
    -- The seq: the trigger outbox_assign_seq's, from the stream's counter.
    INSERT INTO onceflow.outbox AS o (event_id, topic, source, event_type, content_type, record_key, headers, payload)
    -- A generated id is a UUIDv7 (RFC 9562), like Go's and enqueue_batch's:
    -- 48 bits of Unix milliseconds, the version 7, then a version-4 UUID's
    -- random bits from its 13th hex digit on.
    VALUES (coalesce(enqueue.event_id,
                     (SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(gen_random_uuid()::text, 16)
                        FROM lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') AS h)),
            enqueue.topic, enqueue.source,
            enqueue.event_type, 'application/json', convert_to(enqueue.key, 'UTF8'), v_headers, v_payload)
    RETURNING o.event_id, o.seq INTO v_result.event_id, v_result.seq;
    RETURN v_result;
END
$function$
;
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

    -- event_id: unique.
    SELECT u.id INTO v_reason
      FROM unnest(a_eid) AS u(id)
     WHERE u.id IS NOT NULL
       AND EXISTS (SELECT 1 FROM onceflow.outbox o WHERE o.event_id = u.id)
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
