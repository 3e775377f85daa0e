DROP FUNCTION IF EXISTS onceflow.enqueue_batch(jsonb);
