DROP TABLE onceflow.reconcile_runs;
