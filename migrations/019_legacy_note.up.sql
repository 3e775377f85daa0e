-- The operator's note of `relay identity legacy adopt|discard -note "…"`
-- is kept with the decision (it was only printed).
ALTER TABLE onceflow.relay_legacy_checkpoint ADD COLUMN decision_note text;
