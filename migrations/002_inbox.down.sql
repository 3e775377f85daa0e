DROP TABLE IF EXISTS onceflow.consumer_offsets;
DROP TABLE IF EXISTS onceflow.inbox;
