-- Inbox: the consumer's dedup ledger. The primary key is the dedup key; the
-- insert, the handler's writes, the seq-state update and the partition's next
-- offset commit in one transaction.
--
-- `consumer` names the logical consumer that owns the ledger (default
-- 'default'); two deployments that must each apply every event use two names.

CREATE TABLE onceflow.inbox (
    consumer      text        NOT NULL,
    event_id      text        NOT NULL,
    source        text        NOT NULL,
    seq           bigint,
    event_type    text        NOT NULL,
    topic         text        NOT NULL,
    kafka_partition integer   NOT NULL,
    kafka_offset  bigint      NOT NULL,
    -- processed | parked | dead | held
    status        text        NOT NULL,
    late          boolean     NOT NULL DEFAULT false,
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    -- Kept only while the event may still need applying (parked, dead, held).
    headers       jsonb,
    payload       bytea,
    received_at   timestamptz NOT NULL DEFAULT now(),
    processed_at  timestamptz,
    PRIMARY KEY (consumer, event_id),
    CONSTRAINT inbox_status_check CHECK (status IN ('processed', 'parked', 'dead', 'held'))
);

-- Dead letters and held events for operators.
CREATE INDEX inbox_attention ON onceflow.inbox (consumer, status, received_at)
    WHERE status IN ('dead', 'held');
-- Retention pruning by age.
CREATE INDEX inbox_received_at ON onceflow.inbox (received_at);

-- Next offset per partition, written in the same transaction as the events it
-- covers; on assignment the consumer seeks to it when it is ahead of Kafka's
-- committed offset.
CREATE TABLE onceflow.consumer_offsets (
    group_id        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    next_offset     bigint      NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, kafka_partition)
);
