-- Back to migration 021's: ids drawn by the identity are kept whether or not
-- the transaction had an xid, and the relay's mark goes.
DROP FUNCTION onceflow.outbox_scan_mark();

CREATE OR REPLACE FUNCTION onceflow.outbox_assign_seq() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_last   bigint;
    v_top    bigint;
    v_top_id bigint;
    v_why    text;
BEGIN
    -- A row without a source or topic fails the outbox's own NOT NULL
    -- constraint: leave it to that, with its usual error.
    IF NEW.source IS NULL OR NEW.topic IS NULL THEN
        RETURN NEW;
    END IF;
    v_why := onceflow.source_refusal(NEW.source, NULL);
    IF v_why IS NOT NULL THEN
        RAISE EXCEPTION 'onceflow.outbox: %', v_why USING ERRCODE = '42501';
    END IF;
    SELECT c.last_seq INTO v_last FROM onceflow.source_seq c
     WHERE c.source = NEW.source AND c.topic = NEW.topic
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO onceflow.source_seq AS c (source, topic, last_seq)
        VALUES (NEW.source, NEW.topic,
                coalesce((SELECT l.last_seq FROM onceflow.source_seq_legacy l WHERE l.source = NEW.source), 0))
        ON CONFLICT (source, topic) DO NOTHING;
        SELECT c.last_seq INTO STRICT v_last FROM onceflow.source_seq c
         WHERE c.source = NEW.source AND c.topic = NEW.topic
           FOR UPDATE;
    END IF;
    -- The counter is current as of the end of the last statement; this
    -- statement's earlier rows of the stream come after it.
    SELECT o.seq, o.id INTO v_top, v_top_id FROM onceflow.outbox o
     WHERE o.source = NEW.source AND o.topic = NEW.topic
     ORDER BY o.seq DESC
     LIMIT 1;
    NEW.seq := greatest(v_last, v_top) + 1;
    IF NEW.id IS NULL OR NEW.id <= v_top_id THEN
        NEW.id := nextval('onceflow.outbox_id_seq');
    END IF;
    RETURN NEW;
END
$fn$;

-- onceflow.enqueue without the statement 024 added.
DO $do$
DECLARE
    v_def text := pg_get_functiondef('onceflow.enqueue(text, text, text, jsonb, text, jsonb, text, text, text)'::regprocedure);
    v_add constant text := E'    -- The xid before the row''s id is drawn (the relay''s scan floor,\n'
                           '    -- migration 024), so that the trigger keeps the id.\n'
                           '    PERFORM pg_current_xact_id();\n';
BEGIN
    EXECUTE replace(v_def, v_add, '');
END
$do$;
