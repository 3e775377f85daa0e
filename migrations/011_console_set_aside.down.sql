DROP FUNCTION IF EXISTS onceflow.relay_set_aside(integer);
