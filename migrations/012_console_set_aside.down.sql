DROP FUNCTION IF EXISTS onceflow.prune_outbox_set_aside(interval, integer);
DROP FUNCTION IF EXISTS onceflow.prune_admin_audit(text, interval, integer);
DROP FUNCTION IF EXISTS onceflow.relay_set_aside(integer);
