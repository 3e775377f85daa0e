-- onceflow.enqueue_batch, cheaper per event; what it accepts, refuses and
-- returns is migration 010's (the same checks in the same order, the same
-- messages and SQLSTATEs). Measured against 010 (docs/performance.md,
-- "Write path and growth, round 4"):
--
--   * the JSON array is walked once: every field is extracted once, the
--     payload is rendered to bytes once (010 walked the array three times
--     and rendered each payload twice: once to check its size, once to
--     insert it), and the checks run on the extracted values;
--   * the rows are then inserted from arrays, by the statement EnqueueBatch
--     sends from Go;
--   * generated event ids are UUIDv7, like Go's: time-ordered, so they land
--     at the right edge of the outbox's event_id index instead of on a
--     random page of it (010 used random version-4 UUIDs). The 48-bit
--     millisecond time is taken once per call; the rest of each id is
--     random.
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
