DROP TABLE onceflow.inbox_id_time;
ALTER TABLE onceflow.inbox DROP CONSTRAINT inbox_id_time;
