DROP FUNCTION IF EXISTS onceflow.enqueue(text, text, text, jsonb, text, jsonb, text);
DROP TYPE IF EXISTS onceflow.enqueued;
DROP TABLE IF EXISTS onceflow.relay_lease;
DROP TABLE IF EXISTS onceflow.outbox;
DROP FUNCTION IF EXISTS onceflow.outbox_notify();
DROP TABLE IF EXISTS onceflow.source_seq;
