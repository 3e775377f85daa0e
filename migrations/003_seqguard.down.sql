DROP TABLE IF EXISTS onceflow.seq_gaps;
DROP INDEX IF EXISTS onceflow.inbox_parked;
DROP TABLE IF EXISTS onceflow.seq_state;
