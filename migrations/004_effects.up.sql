-- Effects ledger for fenced external side effects: the intent is recorded
-- before the call, the result after it; a replay with the same idempotency key
-- returns the recorded result.
CREATE TABLE onceflow.effects (
    idempotency_key text        PRIMARY KEY,
    event_id        text,
    -- intent | done
    status          text        NOT NULL DEFAULT 'intent',
    attempts        integer     NOT NULL DEFAULT 0,
    result_code     integer,
    result          jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    CONSTRAINT effects_status CHECK (status IN ('intent', 'done'))
);
CREATE INDEX effects_created_at ON onceflow.effects (created_at);
-- Retention prunes the done effects of the events whose inbox rows it prunes.
CREATE INDEX effects_event_id ON onceflow.effects (event_id);
