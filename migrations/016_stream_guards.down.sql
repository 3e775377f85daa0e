-- Back to one guard state per (consumer, source). The state, gaps and parked
-- rows of producers' streams cannot be kept beside the legacy ones: their
-- seq_state and seq_gaps rows are deleted, and their parked inbox rows become
-- the legacy stream's (run the down path only with no producer's stream
-- parked, or review the parked rows after it).

DO $do$
DECLARE
    v_fn   regprocedure;
    v_def  text;
    v_old  constant text := $s$'content-type', 'traceparent', 'producer')$s$;
    v_new  constant text := $s$'content-type', 'traceparent')$s$;
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'onceflow'::regnamespace AND p.proname IN ('enqueue', 'enqueue_batch')
        ORDER BY p.oid
    LOOP
        v_def := pg_get_functiondef(v_fn);
        IF strpos(v_def, v_old) > 0 THEN
            EXECUTE replace(v_def, v_old, v_new);
        END IF;
    END LOOP;
END
$do$;

ALTER TABLE onceflow.inbox DROP COLUMN producer;

DELETE FROM onceflow.seq_gaps WHERE producer <> '';
DROP INDEX onceflow.seq_gaps_source;
CREATE INDEX seq_gaps_source ON onceflow.seq_gaps (consumer, source, from_seq);
DROP INDEX onceflow.seq_gaps_open_from;
CREATE UNIQUE INDEX seq_gaps_open_from ON onceflow.seq_gaps (consumer, source, from_seq) WHERE state = 'open';
ALTER TABLE onceflow.seq_gaps DROP CONSTRAINT seq_gaps_stream;
ALTER TABLE onceflow.seq_gaps DROP COLUMN topic;
ALTER TABLE onceflow.seq_gaps DROP COLUMN producer;

DELETE FROM onceflow.seq_state WHERE producer <> '';
ALTER TABLE onceflow.seq_state DROP CONSTRAINT seq_state_stream;
ALTER TABLE onceflow.seq_state DROP CONSTRAINT seq_state_pkey;
ALTER TABLE onceflow.seq_state ADD PRIMARY KEY (consumer, source);
ALTER TABLE onceflow.seq_state DROP COLUMN topic;
ALTER TABLE onceflow.seq_state DROP COLUMN producer;
