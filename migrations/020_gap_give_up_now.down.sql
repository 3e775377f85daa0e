-- The audit is append-only: its gap.give_up rows stay, so the narrower check
-- comes back NOT VALID (it holds for new rows only).
ALTER TABLE onceflow.admin_audit DROP CONSTRAINT admin_audit_action;
ALTER TABLE onceflow.admin_audit ADD CONSTRAINT admin_audit_action
    CHECK (action IN ('dlq.replay', 'gap.resolve')) NOT VALID;
-- Gaps given up on an operator's request read as timed out: they were given
-- up because of a deadline the operator moved.
UPDATE onceflow.seq_gaps SET give_up_reason = 'timeout' WHERE give_up_reason = 'operator';
ALTER TABLE onceflow.seq_gaps DROP CONSTRAINT seq_gaps_reason;
ALTER TABLE onceflow.seq_gaps ADD CONSTRAINT seq_gaps_reason CHECK (
    (state = 'given_up') = (give_up_reason IS NOT NULL)
    AND (give_up_reason IS NULL OR give_up_reason IN ('timeout', 'max_parked')));
ALTER TABLE onceflow.seq_gaps DROP CONSTRAINT seq_gaps_requested;
ALTER TABLE onceflow.seq_gaps DROP COLUMN give_up_requested_at;
ALTER TABLE onceflow.seq_gaps DROP COLUMN give_up_requested_by;
