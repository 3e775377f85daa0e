ALTER TABLE onceflow.relay_legacy_checkpoint DROP COLUMN decision_note;
