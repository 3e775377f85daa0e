-- Tracing (docs/tracing.md).

-- A given-up gap records the trace ids of the events that waited behind it
-- (the W3C trace ids of their traceparent headers, at most ten), so that an
-- on-call engineer can open the traces of the requests that produced them.
-- NULL when none of them carried a traceparent.
ALTER TABLE onceflow.seq_gaps ADD COLUMN trace_ids text[];

-- onceflow.enqueue takes the producer's W3C trace context, so that a producer
-- in any language joins its trace to the relay's and the consumer's spans:
-- two optional parameters, checked as the Go API checks them. PostgreSQL
-- cannot add parameters to a function in place, so the new signature is
-- created beside the old one, given the same EXECUTE grants (and owner, when
-- the migrator may set it), and the old one is dropped. Calls by position
-- or by name keep working: the new parameters come last, with defaults.
CREATE FUNCTION onceflow.enqueue(
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

-- The new signature gets the old one's EXECUTE grants (PUBLIC's included)
-- and its owner, when the migrator may hand it over; then the old one goes.
-- deploy/sql/roles.sql grants every onceflow.enqueue anyway: this keeps
-- producers working between the migration and the script's next run.
DO $do$
DECLARE
    v_old   regprocedure := 'onceflow.enqueue(text,text,text,jsonb,text,jsonb,text)'::regprocedure;
    v_new   regprocedure := 'onceflow.enqueue(text,text,text,jsonb,text,jsonb,text,text,text)'::regprocedure;
    v_acl   aclitem[];
    v_owner oid;
    r       record;
BEGIN
    SELECT proacl, proowner INTO v_acl, v_owner FROM pg_proc WHERE oid = v_old;
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', v_new);
    IF v_acl IS NULL THEN -- the default: PUBLIC may execute
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
            NULL; -- the migrator's own function until roles.sql hands it over
        END;
    END IF;
    EXECUTE format('DROP FUNCTION %s', v_old);
END
$do$;
