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
