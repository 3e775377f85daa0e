-- Relay identity, set-aside rows and stricter enqueue checks (docs/relay.md).

-- This database's identity. Relays of different databases often share one
-- Kafka cluster: the relay derives its default transactional.id and its
-- checkpoint key from this id (plus the shard), and every checkpoint record
-- carries it, so that no relay ever fences another database's relay or uses
-- another database's checkpoint.
--
-- A copy of the database (CREATE DATABASE … TEMPLATE, dump and restore,
-- pg_upgrade) carries the same row. Where the row was made is recorded
-- (cluster system identifier and database oid): a relay that finds itself
-- somewhere else refuses to publish until an operator says whether this
-- database replaces the original (`relay identity adopt`) or is a separate
-- copy (`relay identity reset`). A copy of a database whose relay never
-- published gets a new identity by itself at its relay's first start.
CREATE TABLE onceflow.database_identity (
    singleton         boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    id                uuid        NOT NULL DEFAULT gen_random_uuid(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    -- Where the identity belongs: pg_control_system().system_identifier
    -- (NULL when it could not be read) and the database's oid.
    cluster_system_id text,
    database_oid      oid         NOT NULL,
    -- Set when a relay first published under this identity.
    first_used_at     timestamptz,
    -- The last `relay identity adopt` or `reset`, for the record.
    changed_at        timestamptz,
    changed_by        text,
    change_note       text
);

DO $identity$
DECLARE
    v_cluster text;
BEGIN
    BEGIN
        SELECT system_identifier::text INTO v_cluster FROM pg_control_system();
    EXCEPTION WHEN insufficient_privilege OR undefined_function THEN
        v_cluster := NULL;
    END;
    INSERT INTO onceflow.database_identity (cluster_system_id, database_oid)
    SELECT v_cluster, d.oid FROM pg_database d WHERE d.datname = current_database();
END
$identity$;

-- Shards whose relay ran before identities existed (migration 008). Their
-- relays wrote checkpoints under the bare shard name, which every database's
-- relay shared, so such a checkpoint cannot be proven to be this database's.
-- The relay settles each row at its first start: by itself when the old
-- checkpoint is absent or names nothing unpublished here, otherwise as an
-- operator decides (`relay identity legacy adopt|discard -shard S`).
CREATE TABLE onceflow.relay_legacy_checkpoint (
    shard        text        PRIMARY KEY,
    noted_at     timestamptz NOT NULL DEFAULT now(),
    decision     text        CHECK (decision IN ('adopt', 'discard')),
    decided_at   timestamptz,
    decided_by   text,
    settled_at   timestamptz,
    outcome      text
);
INSERT INTO onceflow.relay_legacy_checkpoint (shard) SELECT shard FROM onceflow.relay_lease;

-- Rows the relay set aside: Kafka refused them for a reason that retrying
-- the same record cannot fix by itself (too large for the topic, an illegal
-- topic name, …) or that needs the topic or its ACLs fixed. While a row is
-- set aside (resolved_at IS NULL and retry_at not yet reached), the relay
-- publishes no row of its source, so the source stays in seq order; every
-- other source keeps flowing.
--
-- One row per outbox row (outbox_id), opened when it is first set aside and
-- resolved when it is published (after `relay outbox failed retry` or an
-- automatic retry) or skipped (`relay outbox failed skip`: the outbox row is
-- deleted and copied into skipped_row; its seq never reaches the topic).
CREATE TABLE onceflow.outbox_set_aside (
    outbox_id       bigint      PRIMARY KEY,   -- onceflow.outbox.id (no foreign key: skip deletes the outbox row)
    event_id        text        NOT NULL,
    topic           text        NOT NULL,
    source          text        NOT NULL,
    seq             bigint      NOT NULL,
    event_type      text        NOT NULL,
    -- Why: too_large, invalid_topic, topic_authorization, invalid_record,
    -- topic_missing or topic_contract; error is the client's or broker's text.
    reason          text        NOT NULL,
    error           text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 1,
    set_aside_at    timestamptz NOT NULL DEFAULT now(),
    last_failed_at  timestamptz NOT NULL DEFAULT now(),
    -- When the relay tries the row again by itself (reasons that may heal:
    -- topic_missing, topic_authorization, topic_contract); NULL waits for an
    -- operator.
    retry_at        timestamptz,
    retried_at      timestamptz,               -- last `relay outbox failed retry`
    retried_by      text,
    resolved_at     timestamptz,
    resolution      text        CHECK (resolution IN ('published', 'skipped')),
    resolved_by     text,
    note            text,
    skipped_row     jsonb,                     -- the outbox row as it was when skipped
    CONSTRAINT outbox_set_aside_resolved CHECK ((resolved_at IS NULL) = (resolution IS NULL))
);
CREATE INDEX outbox_set_aside_open ON onceflow.outbox_set_aside (source) WHERE resolved_at IS NULL;

-- onceflow.enqueue, as in 001, checking what the Go API checks: a topic name
-- Kafka accepts, and no line break or NUL in the identifying fields.
CREATE OR REPLACE FUNCTION onceflow.enqueue(
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
