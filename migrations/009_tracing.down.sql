-- Back to the signature without trace context: the previous version of
-- onceflow.enqueue, given the grants and owner of the one it replaces.
CREATE FUNCTION onceflow.enqueue(
    topic      text,
    source     text,
    event_type text,
    payload    jsonb,
    event_id   text  DEFAULT NULL,
    headers    jsonb DEFAULT '{}'::jsonb,
    key        text  DEFAULT NULL
) RETURNS onceflow.enqueued
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_payload bytea := convert_to(enqueue.payload::text, 'UTF8');
    v_bad     text;
    v_result  onceflow.enqueued;
BEGIN
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

    -- event_id: unique.
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
           enqueue.event_type, 'application/json', convert_to(enqueue.key, 'UTF8'), enqueue.headers, v_payload
      FROM s
    RETURNING o.event_id, o.seq INTO v_result.event_id, v_result.seq;
    RETURN v_result;
END
$fn$;

DO $do$
DECLARE
    v_old   regprocedure := 'onceflow.enqueue(text,text,text,jsonb,text,jsonb,text,text,text)'::regprocedure;
    v_new   regprocedure := 'onceflow.enqueue(text,text,text,jsonb,text,jsonb,text)'::regprocedure;
    v_acl   aclitem[];
    v_owner oid;
    r       record;
BEGIN
    SELECT proacl, proowner INTO v_acl, v_owner FROM pg_proc WHERE oid = v_old;
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_new);
    IF v_acl IS NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', v_new);
    END IF;
    FOR r IN SELECT a.grantee FROM aclexplode(v_acl) AS a
              WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> v_owner LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', v_new,
                       CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r.grantee)) END);
    END LOOP;
    IF v_owner <> (SELECT oid FROM pg_roles WHERE rolname = current_user) THEN
        BEGIN
            EXECUTE format('ALTER FUNCTION %s OWNER TO %s', v_new, quote_ident(pg_get_userbyid(v_owner)));
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;
        END;
    END IF;
    EXECUTE format('DROP FUNCTION %s', v_old);
END
$do$;

ALTER TABLE onceflow.seq_gaps DROP COLUMN trace_ids;
