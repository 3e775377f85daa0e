-- Outbox: events written by producers inside their own transactions and
-- published to Kafka by the relay. See docs/relay.md for why the relay polls
-- unpublished rows instead of a `WHERE id > last_seen` cursor.

-- Per-source sequence counters. Enqueue locks the source's row in the same
-- statement that inserts the outbox row, so producers of one source serialise
-- until commit: seqs are gap-free and, per source, id order equals seq order.
CREATE TABLE onceflow.source_seq (
    source     text   PRIMARY KEY,
    last_seq   bigint NOT NULL CHECK (last_seq >= 0)
);

CREATE TABLE onceflow.outbox (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id      text        NOT NULL,
    topic         text        NOT NULL,
    source        text        NOT NULL,
    seq           bigint      NOT NULL CHECK (seq > 0),
    event_type    text        NOT NULL,
    content_type  text        NOT NULL DEFAULT 'application/json',
    record_key    bytea,                          -- NULL: the source is the key
    headers       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    payload       bytea       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz,
    CONSTRAINT outbox_event_id_key UNIQUE (event_id),
    CONSTRAINT outbox_source_seq_key UNIQUE (source, seq),
    CONSTRAINT outbox_source_not_empty CHECK (source <> ''),
    CONSTRAINT outbox_event_type_not_empty CHECK (event_type <> ''),
    CONSTRAINT outbox_topic_not_empty CHECK (topic <> '')
);

-- The relay's work queue: only unpublished rows, so it stays small.
CREATE INDEX outbox_unpublished ON onceflow.outbox (id) WHERE published_at IS NULL;
-- Retention pruning of published rows.
CREATE INDEX outbox_published_at ON onceflow.outbox (published_at) WHERE published_at IS NOT NULL;

-- Relay leadership: one lease row per shard. A leader renews its lease; a
-- standby takes it over once it has expired. `epoch` grows on every change
-- of holder.
CREATE TABLE onceflow.relay_lease (
    shard       text        PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL DEFAULT 1,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

-- onceflow.enqueue: the Go API's Enqueue for producers in any language.
-- Returns the event id (generated unless given) and the per-source seq. An
-- event_id that already exists raises unique_violation (SQLSTATE 23505)
-- naming it; the producer's transaction is then aborted, like any constraint
-- violation. A deadlock (40P01) between producers locking several sources in
-- different orders is retryable: lock sources in one fixed order.
CREATE TYPE onceflow.enqueued AS (event_id text, seq bigint);

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
    IF enqueue.topic IS NULL OR enqueue.topic = '' THEN
        RAISE EXCEPTION 'onceflow.enqueue: topic is missing or empty' USING ERRCODE = '22023';
    END IF;
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
    IF enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'onceflow.enqueue: payload is missing' USING ERRCODE = '22023';
    END IF;
    IF octet_length(v_payload) > 1048576 THEN
        RAISE EXCEPTION 'onceflow.enqueue: payload is % bytes, over the limit of 1048576', octet_length(v_payload)
            USING ERRCODE = '22023';
    END IF;
    IF enqueue.event_id = '' OR octet_length(enqueue.event_id) > 512 THEN
        RAISE EXCEPTION 'onceflow.enqueue: event_id must be 1 to 512 bytes' USING ERRCODE = '22023';
    END IF;
    IF enqueue.headers IS NULL OR jsonb_typeof(enqueue.headers) <> 'object' THEN
        RAISE EXCEPTION 'onceflow.enqueue: headers must be a JSON object of strings' USING ERRCODE = '22023';
    END IF;
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

-- Optional wake-up for the relay (relay run -listen). NOTIFY takes a global
-- lock at commit and serializes committing producers, so the trigger is
-- created disabled; enable it with
--   ALTER TABLE onceflow.outbox ENABLE TRIGGER outbox_notify;
-- The relay still polls: a notification only shortens its wait.
CREATE FUNCTION onceflow.outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('onceflow_outbox', '');
    RETURN NULL;
END
$fn$;
CREATE TRIGGER outbox_notify AFTER INSERT ON onceflow.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION onceflow.outbox_notify();
ALTER TABLE onceflow.outbox DISABLE TRIGGER outbox_notify;
