DROP FUNCTION onceflow.relay_status();
DROP TABLE onceflow.admin_audit;
