DROP TABLE IF EXISTS onceflow.relay_lease;
DROP TABLE IF EXISTS onceflow.outbox;
DROP TABLE IF EXISTS onceflow.source_seq;
