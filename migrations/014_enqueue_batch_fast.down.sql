-- Back to migration 010's onceflow.enqueue_batch (same signature, so the
-- grants on it stay).
CREATE OR REPLACE FUNCTION onceflow.enqueue_batch(events jsonb)
RETURNS TABLE (event_id text, seq bigint)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_ord    bigint;
    v_reason text;
BEGIN
    IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'onceflow.enqueue_batch: events must be a JSON array of objects' USING ERRCODE = '22023';
    END IF;

    -- onceflow.enqueue's checks, for every event at once.
    SELECT x.ord, x.reason INTO v_ord, v_reason
      FROM (
        SELECT e.ord, CASE
            WHEN jsonb_typeof(e.v) <> 'object' THEN 'is not a JSON object'
            WHEN e.v->>'topic' IS NULL OR e.v->>'topic' = '' THEN 'topic is missing or empty'
            WHEN octet_length(e.v->>'topic') > 249 THEN format('topic is %s bytes, over Kafka''s limit of 249', octet_length(e.v->>'topic'))
            WHEN e.v->>'topic' !~ '^[A-Za-z0-9._-]+$' OR e.v->>'topic' IN ('.', '..') THEN
                format('topic %s is not a legal Kafka topic name (ASCII letters, digits, ''.'', ''_'' and ''-''; not "." or "..")', quote_literal(e.v->>'topic'))
            WHEN e.v->>'source' IS NULL OR e.v->>'source' = '' THEN 'source is missing or empty'
            WHEN octet_length(e.v->>'source') > 512 THEN 'source is over 512 bytes'
            WHEN e.v->>'event_type' IS NULL OR e.v->>'event_type' = '' THEN 'event_type is missing or empty'
            WHEN octet_length(e.v->>'event_type') > 256 THEN 'event_type is over 256 bytes'
            WHEN e.v->>'event_id' = '' OR octet_length(e.v->>'event_id') > 512 THEN 'event_id must be 1 to 512 bytes'
            WHEN strpos(e.v->>'source', chr(10)) > 0 OR strpos(e.v->>'source', chr(13)) > 0 THEN 'source contains a control character (line break)'
            WHEN strpos(e.v->>'event_type', chr(10)) > 0 OR strpos(e.v->>'event_type', chr(13)) > 0 THEN 'event_type contains a control character (line break)'
            WHEN strpos(e.v->>'event_id', chr(10)) > 0 OR strpos(e.v->>'event_id', chr(13)) > 0 THEN 'event_id contains a control character (line break)'
            WHEN NOT e.v ? 'payload' THEN 'payload is missing'
            WHEN octet_length(convert_to((e.v->'payload')::text, 'UTF8')) > 1048576 THEN
                format('payload is %s bytes, over the limit of 1048576', octet_length(convert_to((e.v->'payload')::text, 'UTF8')))
            WHEN e.v ? 'headers' AND jsonb_typeof(e.v->'headers') <> 'object' THEN 'headers must be a JSON object of strings'
            WHEN e.v ? 'headers' AND EXISTS (
                SELECT 1 FROM jsonb_each(e.v->'headers') AS h(k, hv)
                 WHERE jsonb_typeof(h.hv) <> 'string'
                    OR h.k = ''
                    OR lower(h.k) IN ('event-id', 'source', 'seq', 'event-type', 'content-type', 'traceparent')
                    OR octet_length(h.k) + octet_length(h.hv #>> '{}') > 8192) THEN
                'headers: a key is reserved, empty, too long or not a string'
            WHEN e.v ? 'key' AND jsonb_typeof(e.v->'key') NOT IN ('string', 'null') THEN 'key must be a string'
        END AS reason
          FROM jsonb_array_elements(events) WITH ORDINALITY AS e(v, ord)
      ) x
     WHERE x.reason IS NOT NULL
     ORDER BY x.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'onceflow.enqueue_batch: event %: %', v_ord, v_reason USING ERRCODE = '22023';
    END IF;

    -- event_id: unique.
    SELECT e.v->>'event_id' INTO v_reason
      FROM jsonb_array_elements(events) AS e(v)
     WHERE e.v->>'event_id' IS NOT NULL
       AND EXISTS (SELECT 1 FROM onceflow.outbox o WHERE o.event_id = e.v->>'event_id')
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'onceflow.enqueue_batch: event_id % already exists', quote_literal(v_reason) USING ERRCODE = '23505';
    END IF;

    RETURN QUERY
    WITH m AS (
        SELECT coalesce(e.v->>'event_id', gen_random_uuid()::text) AS eid, e.v->>'topic' AS topic, e.v->>'source' AS source,
               e.v->>'event_type' AS event_type, convert_to(e.v->>'key', 'UTF8') AS record_key,
               coalesce(e.v->'headers', '{}'::jsonb) AS headers, convert_to((e.v->'payload')::text, 'UTF8') AS payload, e.ord,
               row_number() OVER (PARTITION BY e.v->>'source' ORDER BY e.ord) AS k
          FROM jsonb_array_elements(events) WITH ORDINALITY AS e(v, ord)
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
