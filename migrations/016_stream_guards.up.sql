-- Streams (docs/seqguard.md, "Streams"): a consumer orders and dedups by seq
-- per stream, what one producer wrote for one topic and source (I5), not per
-- source. The producer is the relay's database identity, carried in the
-- envelope's "producer" header.
--
-- A stream is (source, producer, topic). Rows written before this migration
-- become legacy streams: producer and topic '' (one stream per source across
-- topics, as the guard kept them), which records without a producer header
-- keep using. The first event of a producer's stream adopts its source's
-- legacy last_applied when it continues it, so an upgraded source sees no gap
-- (the store does it; nothing is copied here).

ALTER TABLE onceflow.seq_state ADD COLUMN producer text NOT NULL DEFAULT '';
ALTER TABLE onceflow.seq_state ADD COLUMN topic text NOT NULL DEFAULT '';
ALTER TABLE onceflow.seq_state DROP CONSTRAINT seq_state_pkey;
ALTER TABLE onceflow.seq_state ADD PRIMARY KEY (consumer, source, producer, topic);
-- A legacy stream has both or neither.
ALTER TABLE onceflow.seq_state ADD CONSTRAINT seq_state_stream CHECK ((producer = '') = (topic = ''));

ALTER TABLE onceflow.seq_gaps ADD COLUMN producer text NOT NULL DEFAULT '';
ALTER TABLE onceflow.seq_gaps ADD COLUMN topic text NOT NULL DEFAULT '';
ALTER TABLE onceflow.seq_gaps ADD CONSTRAINT seq_gaps_stream CHECK ((producer = '') = (topic = ''));
DROP INDEX onceflow.seq_gaps_open_from;
CREATE UNIQUE INDEX seq_gaps_open_from ON onceflow.seq_gaps (consumer, source, producer, topic, from_seq) WHERE state = 'open';
DROP INDEX onceflow.seq_gaps_source;
CREATE INDEX seq_gaps_source ON onceflow.seq_gaps (consumer, source, producer, topic, from_seq);

-- The producer of an inbox row's event ('' when its record had no producer
-- header, and for every row written before this migration). A parked row
-- belongs to the stream of its source, producer and (for a producer's
-- stream) topic; inbox_parked (consumer, source, seq) still finds them.
ALTER TABLE onceflow.inbox ADD COLUMN producer text NOT NULL DEFAULT '';

-- "producer" is reserved by the envelope: the enqueue functions refuse it as
-- an application header. The functions' current bodies (whatever migration
-- wrote them last) get 'producer' added to their reserved-name list, and
-- nothing else changes; each must have the list exactly once (or reserve
-- 'producer' already).
DO $do$
DECLARE
    v_fn   regprocedure;
    v_def  text;
    v_old  constant text := $s$'content-type', 'traceparent')$s$;
    v_new  constant text := $s$'content-type', 'traceparent', 'producer')$s$;
    v_done int := 0;
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'onceflow'::regnamespace AND p.proname IN ('enqueue', 'enqueue_batch')
        ORDER BY p.oid
    LOOP
        v_def := pg_get_functiondef(v_fn);
        v_done := v_done + 1;
        CONTINUE WHEN strpos(v_def, v_new) > 0; -- reserved already
        IF (length(v_def) - length(replace(v_def, v_old, ''))) / length(v_old) <> 1 THEN
            RAISE EXCEPTION 'migration 016: % does not hold the reserved header list exactly once', v_fn;
        END IF;
        EXECUTE replace(v_def, v_old, v_new);
    END LOOP;
    IF v_done < 2 THEN
        RAISE EXCEPTION 'migration 016: found % of the enqueue functions, want enqueue and enqueue_batch', v_done;
    END IF;
END
$do$;
