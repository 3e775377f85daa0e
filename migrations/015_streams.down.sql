-- Back to one seq counter per source (migration 001's onceflow.source_seq).
--
-- The per-source unique key (source, seq) cannot come back while the outbox
-- holds two rows of one source with the same seq (one per topic, written
-- after migration 015): publish and prune them first (or delete them), then
-- migrate down.
DO $do$
DECLARE
    v_source text;
    v_seq    bigint;
BEGIN
    SELECT o.source, o.seq INTO v_source, v_seq FROM onceflow.outbox o
     GROUP BY o.source, o.seq HAVING count(*) > 1 LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'down of 015_streams: the outbox holds several rows of source % with seq % (one per topic); the per-source key (source, seq) cannot be restored until they are published and pruned or deleted',
            quote_literal(v_source), v_seq USING ERRCODE = '23505';
    END IF;
END
$do$;

DROP TRIGGER outbox_assign_seq ON onceflow.outbox;
DROP TRIGGER outbox_check_seq ON onceflow.outbox;
DROP FUNCTION onceflow.outbox_assign_seq();
DROP FUNCTION onceflow.outbox_check_seq();

ALTER TABLE onceflow.outbox DROP CONSTRAINT outbox_source_topic_seq_key;
ALTER TABLE onceflow.outbox ADD CONSTRAINT outbox_source_seq_key UNIQUE (source, seq);

-- Each source's counter: the highest of its streams' counters, its legacy
-- counter and its seqs still in the outbox, so that no seq is handed out
-- twice for a source.
INSERT INTO onceflow.source_seq_legacy AS l (source, last_seq)
SELECT x.source, max(x.last_seq)
  FROM (SELECT c.source, c.last_seq FROM onceflow.source_seq c
        UNION ALL
        SELECT o.source, max(o.seq) FROM onceflow.outbox o GROUP BY o.source) x
 GROUP BY x.source
ON CONFLICT (source) DO UPDATE SET last_seq = greatest(l.last_seq, excluded.last_seq);
DROP TABLE onceflow.source_seq;
ALTER TABLE onceflow.source_seq_legacy RENAME TO source_seq;
ALTER INDEX onceflow.source_seq_legacy_pkey RENAME TO source_seq_pkey;

-- The old enqueue statements write the counters with the producer's rights:
-- the roles that may insert events (deploy/sql/roles.sql's writer role) get
-- back what they had on them.
DO $do$
DECLARE
    v_owner oid := (SELECT relowner FROM pg_class WHERE oid = 'onceflow.outbox'::regclass);
    r       record;
BEGIN
    FOR r IN SELECT DISTINCT x.grantee
               FROM pg_attribute a CROSS JOIN LATERAL aclexplode(a.attacl) x
              WHERE a.attrelid = 'onceflow.outbox'::regclass AND a.attname = 'event_id'
                AND x.privilege_type = 'INSERT' AND x.grantee <> v_owner LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON onceflow.source_seq TO %s',
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
END
$do$;

-- onceflow.enqueue as migration 009 made it, onceflow.enqueue_batch as
-- migration 014 made it.
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
    WITH s AS (
        INSERT INTO onceflow.source_seq AS c (source, last_seq) VALUES (enqueue.source, 1)
        ON CONFLICT (source) DO UPDATE SET last_seq = c.last_seq + 1
        RETURNING c.last_seq
    )
    INSERT INTO onceflow.outbox AS o (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload)
    SELECT coalesce(enqueue.event_id, gen_random_uuid()::text), enqueue.topic, enqueue.source, s.last_seq,
           enqueue.event_type, 'application/json', convert_to(enqueue.key, 'UTF8'), v_headers, v_payload
      FROM s
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

    RETURN QUERY
    WITH m AS (
        SELECT coalesce(m.eid, v_idprefix || substr(gen_random_uuid()::text, 16)) AS eid, m.topic, m.source,
               m.event_type, m.record_key, m.headers, m.payload, m.ord,
               row_number() OVER (PARTITION BY m.source ORDER BY m.ord) AS k
          FROM unnest(a_ord, a_eid, a_topic, a_source, a_type, a_key, a_headers, a_payload)
               AS m(ord, eid, topic, source, event_type, record_key, headers, payload)
    ), n AS (
        SELECT m.source, count(*) AS n FROM m GROUP BY m.source
    ), c AS (
        INSERT INTO onceflow.source_seq AS c (source, last_seq)
        SELECT n.source, n.n FROM n ORDER BY n.source
        ON CONFLICT (source) DO UPDATE SET last_seq = c.last_seq + excluded.last_seq
        RETURNING c.source, c.last_seq
    ), ins AS (
        INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload)
        SELECT m.eid, m.topic, m.source, c.last_seq - n.n + m.k, m.event_type, 'application/json', m.record_key, m.headers, m.payload
          FROM m JOIN n ON n.source = m.source JOIN c ON c.source = m.source
         ORDER BY m.source, m.k
    )
    SELECT m.eid, c.last_seq - n.n + m.k
      FROM m JOIN n ON n.source = m.source JOIN c ON c.source = m.source
     ORDER BY m.ord;
END
$fn$;

DROP FUNCTION onceflow.next_seqs(text[], text[]);
DROP FUNCTION onceflow.source_refusal(text, text);
