DROP TABLE IF EXISTS onceflow.effects;
