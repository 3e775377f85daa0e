-- Reconcile runs (docs/reliability.md, "Reconcile"): one row per run of
-- `consumer reconcile` that was not started with -record=false, so that the
-- console of every replica shows the last run. The run itself only reads;
-- this row is its one write, in the consumer's database.
CREATE TABLE onceflow.reconcile_runs (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The inbox's logical consumer the run judged.
    consumer    text        NOT NULL,
    topics      text[]      NOT NULL,
    started_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    -- clean | anomalies
    status      text        NOT NULL,
    anomalies   integer     NOT NULL CHECK (anomalies >= 0),
    -- The JSON report (`consumer reconcile -json`), each finding's seqs
    -- capped at 100 ranges.
    report      jsonb       NOT NULL,
    CONSTRAINT reconcile_runs_status CHECK (status IN ('clean', 'anomalies')),
    CONSTRAINT reconcile_runs_status_anomalies CHECK ((status = 'clean') = (anomalies = 0))
);
CREATE INDEX reconcile_runs_last ON onceflow.reconcile_runs (consumer, finished_at DESC);
