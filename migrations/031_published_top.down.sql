---- tern: disable-tx ----
DROP INDEX CONCURRENTLY IF EXISTS onceflow.outbox_published_last_id;
