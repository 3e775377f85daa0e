-- Sequence guards: per (consumer, source) the last applied seq. Never pruned:
-- it is the second line of defence when an inbox row has been pruned.
CREATE TABLE onceflow.seq_state (
    consumer      text        NOT NULL,
    source        text        NOT NULL,
    last_applied  bigint      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, source)
);

-- Parked events live in onceflow.inbox with status 'parked'.
CREATE INDEX inbox_parked ON onceflow.inbox (consumer, source, seq) WHERE status = 'parked';

-- Gaps: a missing seq range of a source, from when it was noticed until it
-- was filled or given up.
CREATE TABLE onceflow.seq_gaps (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer      text        NOT NULL,
    source        text        NOT NULL,
    from_seq      bigint      NOT NULL,
    to_seq        bigint      NOT NULL,
    opened_at     timestamptz NOT NULL,
    deadline      timestamptz NOT NULL,
    -- open | filled | given_up
    state         text        NOT NULL DEFAULT 'open',
    closed_at     timestamptz,
    resolved_at   timestamptz,
    resolved_note text,
    CONSTRAINT seq_gaps_range CHECK (from_seq <= to_seq),
    CONSTRAINT seq_gaps_state CHECK (state IN ('open', 'filled', 'given_up'))
);
CREATE INDEX seq_gaps_open ON onceflow.seq_gaps (deadline) WHERE state = 'open';
CREATE INDEX seq_gaps_source ON onceflow.seq_gaps (consumer, source, from_seq);
