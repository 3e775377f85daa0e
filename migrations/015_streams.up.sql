-- Streams (docs/contract.md, "What `seq` means"): a seq is a sequence per
-- (source, topic) — per stream, with the relay's `producer` header naming the
-- database — instead of one per source across topics, and only the database
-- hands it out.
--
-- Until this migration onceflow.source_seq kept one counter per source, so a
-- source writing to two topics left gaps in each topic's seqs (the other
-- topic's events), and its consumers waited out and paged on gaps that were
-- never going to fill. The counter was written by the enqueue statements,
-- which ran with the producer's rights: a producer role could insert a row
-- with a seq of its choosing, or wind back, max out or lock another source's
-- counter.
--
-- Now onceflow.source_seq has one row per (source, topic): the stream's last
-- seq as of the end of the last statement that wrote to it, and a row lock
-- that serializes the stream's producers until commit. Producers hold no
-- privilege on it; three functions that run with their owner's rights
-- (SECURITY DEFINER, pinned search_path) lock and move it:
--
--   * onceflow.next_seqs(sources, topics) locks the counters of the given
--     streams, in (source, topic) order, and returns each stream's next seq.
--     The batch statements (EnqueueBatch, onceflow.enqueue_batch) call it and
--     insert their rows with the seqs that follow, so no per-row trigger
--     runs for them;
--   * the trigger outbox_assign_seq (BEFORE INSERT, each row, only for a
--     row that names no seq: a hand-written INSERT or COPY that leaves seq
--     out, Enqueue, onceflow.enqueue) locks the stream's counter and gives the
--     row one more than the larger of the counter and the stream's highest seq
--     in the outbox (the rows of this statement so far). A row whose id was
--     drawn before it waited for the lock gets a new id, so that per stream id
--     order stays seq order (R2);
--   * the trigger outbox_check_seq (AFTER INSERT, each statement) checks every
--     stream the statement wrote: its rows, in id order, must carry exactly
--     the counter's next seqs, and come after the stream's previous row; then
--     it moves the counter to the last of them. A statement naming any other
--     seq (a forged 999, a stale guess) is refused with SQLSTATE 23514, and
--     nothing of it is stored.
--
-- A row that is not inserted (rolled back, refused by a constraint, skipped
-- by ON CONFLICT DO NOTHING) takes no seq: the next row gets the same one.
--
-- Carrying over: the per-source counters become onceflow.source_seq_legacy,
-- read once per (source, topic), when the stream's counter row is created:
-- a stream of a source that has a legacy counter continues after the
-- source's last seq (a single-topic source's consumers see no gap); other
-- streams start at 1. A source that wrote to several topics before this
-- migration continues each topic from the source's last seq: each topic's
-- consumers see one last gap, once (the seqs its other topics took since the
-- topic's own last event); no seq is ever handed out twice for one source
-- and topic.

-- The per-source counters, kept for the streams not seeded yet. Nothing
-- writes them any more; the producers' grants on them go.
ALTER TABLE onceflow.source_seq RENAME TO source_seq_legacy;
ALTER INDEX onceflow.source_seq_pkey RENAME TO source_seq_legacy_pkey;

CREATE TABLE onceflow.source_seq (
    source   text   NOT NULL,
    topic    text   NOT NULL,
    last_seq bigint NOT NULL CHECK (last_seq >= 0),
    PRIMARY KEY (source, topic)
);

-- Owner and grants: the new table belongs to the legacy table's owner (when
-- the migrator may hand it over); nobody else keeps any privilege on either.
DO $do$
DECLARE
    v_owner oid := (SELECT relowner FROM pg_class WHERE oid = 'onceflow.source_seq_legacy'::regclass);
    r       record;
BEGIN
    FOR r IN SELECT DISTINCT a.grantee FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
              WHERE c.oid = 'onceflow.source_seq_legacy'::regclass AND a.grantee <> v_owner LOOP
        EXECUTE format('REVOKE ALL ON onceflow.source_seq_legacy FROM %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
    REVOKE ALL ON onceflow.source_seq FROM PUBLIC;
    IF v_owner <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
        BEGIN
            EXECUTE format('ALTER TABLE onceflow.source_seq OWNER TO %s', quote_ident(pg_get_userbyid(v_owner)));
        EXCEPTION WHEN insufficient_privilege THEN
            NULL; -- the migrator's own table until deploy/sql/roles.sql hands it over
        END;
    END IF;
END
$do$;

-- One unique key per stream and seq. Source first, as the old key had it:
-- a lookup by source alone (an operator's query) can still use it, and the
-- triggers' look-ups (a stream's highest seq, its row with a given seq) are
-- one index descent each. No statement of the relay or the retention uses the
-- key (they reach rows by id). Building it holds the outbox's lock for a time
-- that grows with the rows the outbox keeps (the retention window).
ALTER TABLE onceflow.outbox DROP CONSTRAINT outbox_source_seq_key;
ALTER TABLE onceflow.outbox ADD CONSTRAINT outbox_source_topic_seq_key UNIQUE (source, topic, seq);

-- onceflow.next_seqs locks the counter rows of the given streams (creating
-- each on first use, after the source's legacy counter if it has one), in
-- (source, topic) order, and returns each stream's next seq. The locks hold
-- until the transaction ends. The triggers below lock a counter the same way.
-- Why session_user may not enqueue source (with event id event_id), or
-- NULL when it may. Every path asks it before it locks a stream's counter,
-- so that a login cannot hold another's counter (migration 018 gives it its
-- body: source ownership; until then everyone may).
CREATE FUNCTION onceflow.source_refusal(source text, event_id text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT NULL::text
$fn$;
REVOKE ALL ON FUNCTION onceflow.source_refusal(text, text) FROM PUBLIC;

CREATE FUNCTION onceflow.next_seqs(sources text[], topics text[])
RETURNS TABLE (source text, topic text, next_seq bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    r      record;
    v_last bigint;
    v_why  text;
BEGIN
    IF cardinality(next_seqs.sources) IS DISTINCT FROM cardinality(next_seqs.topics) THEN
        RAISE EXCEPTION 'onceflow.next_seqs: sources and topics must be arrays of the same length' USING ERRCODE = '22023';
    END IF;
    -- The fixed lock order: by source, then topic.
    FOR r IN SELECT DISTINCT u.s, u.t FROM unnest(next_seqs.sources, next_seqs.topics) AS u(s, t)
              WHERE u.s IS NOT NULL AND u.t IS NOT NULL
              ORDER BY u.s, u.t LOOP
        v_why := onceflow.source_refusal(r.s, NULL);
        IF v_why IS NOT NULL THEN
            RAISE EXCEPTION 'onceflow.next_seqs: %', v_why USING ERRCODE = '42501';
        END IF;
        SELECT c.last_seq INTO v_last FROM onceflow.source_seq c
         WHERE c.source = r.s AND c.topic = r.t
           FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO onceflow.source_seq AS c (source, topic, last_seq)
            VALUES (r.s, r.t, coalesce((SELECT l.last_seq FROM onceflow.source_seq_legacy l WHERE l.source = r.s), 0))
            ON CONFLICT (source, topic) DO NOTHING;
            SELECT c.last_seq INTO STRICT v_last FROM onceflow.source_seq c
             WHERE c.source = r.s AND c.topic = r.t
               FOR UPDATE;
        END IF;
        source := r.s;
        topic := r.t;
        next_seq := v_last + 1;
        RETURN NEXT;
    END LOOP;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.next_seqs(text[], text[]) FROM PUBLIC;

CREATE FUNCTION onceflow.outbox_assign_seq() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_last   bigint;
    v_top    bigint;
    v_top_id bigint;
    v_why    text;
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
    SELECT o.seq, o.id INTO v_top, v_top_id FROM onceflow.outbox o
     WHERE o.source = NEW.source AND o.topic = NEW.topic
     ORDER BY o.seq DESC
     LIMIT 1;
    NEW.seq := greatest(v_last, v_top) + 1;
    IF NEW.id IS NULL OR NEW.id <= v_top_id THEN
        NEW.id := nextval('onceflow.outbox_id_seq');
    END IF;
    RETURN NEW;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_assign_seq() FROM PUBLIC;

CREATE FUNCTION onceflow.outbox_check_seq() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    r      record;
    v_last bigint;
    v_prev bigint;
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
        SELECT o.id INTO v_prev FROM onceflow.outbox o
         WHERE o.source = r.source AND o.topic = r.topic AND o.seq = v_last;
        IF r.lo <> v_last + 1 OR NOT r.in_order OR v_prev >= r.first_id THEN
            RAISE EXCEPTION 'onceflow.outbox: source % on topic %: the rows carry seqs % to %, but the stream''s next seqs are % on, in id order',
                quote_literal(r.source), quote_literal(r.topic), r.lo, r.hi, v_last + 1
                USING ERRCODE = '23514',
                      HINT = 'Leave seq out: the database gives each row its seq (onceflow.next_seqs tells a batch its seqs).';
        END IF;
        UPDATE onceflow.source_seq c SET last_seq = r.hi
         WHERE c.source = r.source AND c.topic = r.topic;
    END LOOP;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.outbox_check_seq() FROM PUBLIC;

-- The functions belong to the table's owner (when the migrator may hand
-- them over), so that they run with the owner's rights; next_seqs may be
-- called by whoever may call enqueue_batch.
DO $do$
DECLARE
    v_owner oid := (SELECT relowner FROM pg_class WHERE oid = 'onceflow.outbox'::regclass);
    v_acl   aclitem[] := (SELECT proacl FROM pg_proc WHERE oid = 'onceflow.enqueue_batch(jsonb)'::regprocedure);
    v_fn    text;
    r       record;
BEGIN
    IF v_acl IS NULL THEN -- the default: PUBLIC may execute
        GRANT EXECUTE ON FUNCTION onceflow.next_seqs(text[], text[]) TO PUBLIC;
    END IF;
    FOR r IN SELECT a.grantee FROM aclexplode(v_acl) AS a
              WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> v_owner LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION onceflow.next_seqs(text[], text[]) TO %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
    IF v_owner <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
        FOREACH v_fn IN ARRAY ARRAY['onceflow.next_seqs(text[], text[])', 'onceflow.outbox_assign_seq()',
                                    'onceflow.outbox_check_seq()'] LOOP
            BEGIN
                EXECUTE format('ALTER FUNCTION %s OWNER TO %s', v_fn, quote_ident(pg_get_userbyid(v_owner)));
            EXCEPTION WHEN insufficient_privilege THEN
                NULL;
            END;
        END LOOP;
    END IF;
END
$do$;

-- A row that names a seq skips outbox_assign_seq (the WHEN is evaluated
-- without calling it); outbox_check_seq checks every row.
CREATE TRIGGER outbox_assign_seq BEFORE INSERT ON onceflow.outbox
    FOR EACH ROW WHEN (NEW.seq IS NULL) EXECUTE FUNCTION onceflow.outbox_assign_seq();
CREATE TRIGGER outbox_check_seq AFTER INSERT ON onceflow.outbox
    REFERENCING NEW TABLE AS outbox_new
    FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_check_seq();

-- onceflow.enqueue and onceflow.enqueue_batch: what they accept, refuse and
-- return is unchanged (the same checks, messages and SQLSTATEs); they no
-- longer write the counters: the rows they insert get their seqs from the
-- trigger. Same signatures, so their grants stay.
CREATE OR REPLACE FUNCTION onceflow.enqueue(
    topic       text,
    source      text,
    event_type  text,
    payload     jsonb,
    event_id    text  DEFAULT NULL,
    headers     jsonb DEFAULT '{}'::jsonb,
    key         text  DEFAULT NULL,
    traceparent text  DEFAULT NULL,
    tracestate  text  DEFAULT NULL
) RETURNS onceflow.enqueued
LANGUAGE plpgsql AS $fn$
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
        OR lower(h.k) IN ('event-id', 'source', 'seq', 'event-type', 'content-type', 'traceparent')
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
$fn$;

CREATE OR REPLACE FUNCTION onceflow.enqueue_batch(events jsonb)
RETURNS TABLE (event_id text, seq bigint)
LANGUAGE plpgsql AS $fn$
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
                        OR lower(h.k) IN ('event-id', 'source', 'seq', 'event-type', 'content-type', 'traceparent')
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
$fn$;
