ALTER TABLE onceflow.seq_gaps DROP COLUMN trace_ids;
