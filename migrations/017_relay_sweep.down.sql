DROP INDEX IF EXISTS onceflow.outbox_published_id_span;
