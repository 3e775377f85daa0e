-- An operator can give an open gap up now instead of waiting for its
-- deadline (`consumer gaps give-up`, or the console). The request moves the
-- deadline of the stream's open gaps up to the requested range to the time
-- of the request and records who asked; the consumer's gap timer then gives
-- them up at its next tick, releasing the parked events behind them, with
-- the reason 'operator'.
ALTER TABLE onceflow.seq_gaps ADD COLUMN give_up_requested_by text;
ALTER TABLE onceflow.seq_gaps ADD COLUMN give_up_requested_at timestamptz;
ALTER TABLE onceflow.seq_gaps ADD CONSTRAINT seq_gaps_requested
    CHECK ((give_up_requested_by IS NULL) = (give_up_requested_at IS NULL));
-- Checked without a full-table lock held for the scan: NOT VALID, then
-- VALIDATE (SHARE UPDATE EXCLUSIVE only).
ALTER TABLE onceflow.seq_gaps DROP CONSTRAINT seq_gaps_reason;
ALTER TABLE onceflow.seq_gaps ADD CONSTRAINT seq_gaps_reason CHECK (
    (state = 'given_up') = (give_up_reason IS NOT NULL)
    AND (give_up_reason IS NULL OR give_up_reason IN ('timeout', 'max_parked', 'operator'))) NOT VALID;
ALTER TABLE onceflow.seq_gaps VALIDATE CONSTRAINT seq_gaps_reason;
-- The request is audited like the other operator changes.
ALTER TABLE onceflow.admin_audit DROP CONSTRAINT admin_audit_action;
ALTER TABLE onceflow.admin_audit ADD CONSTRAINT admin_audit_action
    CHECK (action IN ('dlq.replay', 'gap.resolve', 'gap.give_up')) NOT VALID;
ALTER TABLE onceflow.admin_audit VALIDATE CONSTRAINT admin_audit_action;
