-- Sequence guards (pkg/seqguard, docs/seqguard.md).
--
-- Per (consumer, source) the last applied seq. Never pruned: it is the second
-- line of defence once retention has pruned an event's inbox row (an old seq
-- that comes back is then recognised as late instead of being applied again
-- as if it were new).
--
-- last_applied is NULL while the row only exists because a transaction locked
-- a source it has not decided anything for yet (the store inserts the row to
-- have something to lock); the first event then follows the start policy.
CREATE TABLE onceflow.seq_state (
    consumer      text        NOT NULL,
    source        text        NOT NULL,
    last_applied  bigint,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, source),
    CONSTRAINT seq_state_last_applied CHECK (last_applied >= 0)
);

-- Parked events live in onceflow.inbox with status 'parked' (headers and
-- payload kept until they are applied).
CREATE INDEX inbox_parked ON onceflow.inbox (consumer, source, seq) WHERE status = 'parked';

-- Gaps: a missing seq range of a source, from when it was noticed until it
-- was filled or given up. Open gaps of a source are disjoint and lie between
-- last_applied and its highest parked seq. An event that fills part of a gap
-- narrows the row (or splits it in two rows); every piece keeps the original
-- opened_at and deadline. A row whose range is wholly filled becomes 'filled'.
CREATE TABLE onceflow.seq_gaps (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer      text        NOT NULL,
    source        text        NOT NULL,
    from_seq      bigint      NOT NULL,
    to_seq        bigint      NOT NULL,
    opened_at     timestamptz NOT NULL,
    -- When the gap is given up: opened_at plus the timeout of the event type
    -- class of the event that opened it, and never earlier than the deadline
    -- of an open gap below it (gaps are given up in seq order).
    deadline      timestamptz NOT NULL,
    -- open | filled | given_up
    state         text        NOT NULL DEFAULT 'open',
    -- For given_up: timeout | max_parked.
    give_up_reason text,
    -- When the gap was filled or given up.
    closed_at     timestamptz,
    -- Set by an operator (`consumer gaps resolve`) after looking into a
    -- given-up gap.
    resolved_at   timestamptz,
    resolved_note text,
    CONSTRAINT seq_gaps_range CHECK (0 < from_seq AND from_seq <= to_seq),
    CONSTRAINT seq_gaps_state CHECK (state IN ('open', 'filled', 'given_up')),
    CONSTRAINT seq_gaps_reason CHECK (
        (state = 'given_up') = (give_up_reason IS NOT NULL)
        AND (give_up_reason IS NULL OR give_up_reason IN ('timeout', 'max_parked'))),
    CONSTRAINT seq_gaps_closed CHECK ((state = 'open') = (closed_at IS NULL))
);
-- The timer's work queue.
CREATE INDEX seq_gaps_open ON onceflow.seq_gaps (deadline) WHERE state = 'open';
-- Open gaps never overlap, so one open gap per start seq.
CREATE UNIQUE INDEX seq_gaps_open_from ON onceflow.seq_gaps (consumer, source, from_seq) WHERE state = 'open';
CREATE INDEX seq_gaps_source ON onceflow.seq_gaps (consumer, source, from_seq);
-- Listing recently given-up gaps for operators.
CREATE INDEX seq_gaps_given_up ON onceflow.seq_gaps (consumer, closed_at) WHERE state = 'given_up';
