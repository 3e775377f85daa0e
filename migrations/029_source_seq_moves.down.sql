-- Back to the counters moved by UPDATE: fold each stream's newest moved
-- value into onceflow.source_seq, then the functions as migration 024 left
-- them.
UPDATE onceflow.source_seq c SET last_seq = m.last_seq
  FROM (SELECT source, topic, max(last_seq) AS last_seq FROM onceflow.source_seq_moves GROUP BY 1, 2) m
 WHERE c.source = m.source AND c.topic = m.topic AND c.last_seq < m.last_seq;

CREATE OR REPLACE FUNCTION onceflow.next_seqs(sources text[], topics text[])
 RETURNS TABLE(source text, topic text, next_seq bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    r      record;
    v_last bigint;
    v_why  text;
BEGIN
    IF cardinality(next_seqs.sources) IS DISTINCT FROM cardinality(next_seqs.topics) THEN
        RAISE EXCEPTION 'onceflow.next_seqs: sources and topics must be arrays of the same length' USING ERRCODE = '22023';
    END IF;
    -- The fixed lock order: by source, then topic.
    FOR r IN SELECT DISTINCT u.s, u.t FROM unnest(next_seqs.sources, next_seqs.topics) AS u(s, t)
              WHERE u.s IS NOT NULL AND u.t IS NOT NULL
              ORDER BY u.s, u.t LOOP
        v_why := onceflow.source_refusal(r.s, NULL);
        IF v_why IS NOT NULL THEN
            RAISE EXCEPTION 'onceflow.next_seqs: %', v_why USING ERRCODE = '42501';
        END IF;
        SELECT c.last_seq INTO v_last FROM onceflow.source_seq c
         WHERE c.source = r.s AND c.topic = r.t
           FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO onceflow.source_seq AS c (source, topic, last_seq)
            VALUES (r.s, r.t, coalesce((SELECT l.last_seq FROM onceflow.source_seq_legacy l WHERE l.source = r.s), 0))
            ON CONFLICT (source, topic) DO NOTHING;
            SELECT c.last_seq INTO STRICT v_last FROM onceflow.source_seq c
             WHERE c.source = r.s AND c.topic = r.t
               FOR UPDATE;
        END IF;
        source := r.s;
        topic := r.t;
        next_seq := v_last + 1;
        RETURN NEXT;
    END LOOP;
END
$function$;

CREATE OR REPLACE FUNCTION onceflow.outbox_check_seq()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    r      record;
    v_last bigint;
    v_prev bigint;
BEGIN
    -- Per stream the statement wrote, in the lock order: its seqs in id
    -- order, and whether each is one more than the one before.
    FOR r IN SELECT x.source, x.topic, min(x.seq) AS lo, max(x.seq) AS hi, min(x.id) AS first_id,
                    bool_and(x.next) AS in_order
               FROM (SELECT n.source, n.topic, n.seq, n.id,
                            coalesce(n.seq = lag(n.seq) OVER (PARTITION BY n.source, n.topic ORDER BY n.id) + 1, true) AS next
                       FROM outbox_new n) x
              GROUP BY x.source, x.topic
              ORDER BY x.source, x.topic LOOP
        SELECT c.last_seq INTO v_last FROM onceflow.source_seq c
         WHERE c.source = r.source AND c.topic = r.topic
           FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO onceflow.source_seq AS c (source, topic, last_seq)
            VALUES (r.source, r.topic,
                    coalesce((SELECT l.last_seq FROM onceflow.source_seq_legacy l WHERE l.source = r.source), 0))
            ON CONFLICT (source, topic) DO NOTHING;
            SELECT c.last_seq INTO STRICT v_last FROM onceflow.source_seq c
             WHERE c.source = r.source AND c.topic = r.topic
               FOR UPDATE;
        END IF;
        SELECT o.id INTO v_prev FROM onceflow.outbox o
         WHERE o.source = r.source AND o.topic = r.topic AND o.seq = v_last;
        IF r.lo <> v_last + 1 OR NOT r.in_order OR v_prev >= r.first_id THEN
            RAISE EXCEPTION 'onceflow.outbox: source % on topic %: the rows carry seqs % to %, but the stream''s next seqs are % on, in id order',
                quote_literal(r.source), quote_literal(r.topic), r.lo, r.hi, v_last + 1
                USING ERRCODE = '23514',
                      HINT = 'Leave seq out: the database gives each row its seq (onceflow.next_seqs tells a batch its seqs).';
        END IF;
        UPDATE onceflow.source_seq c SET last_seq = r.hi
         WHERE c.source = r.source AND c.topic = r.topic;
    END LOOP;
    RETURN NULL;
END
$function$;

CREATE OR REPLACE FUNCTION onceflow.outbox_assign_seq()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_last   bigint;
    v_top    bigint;
    v_top_id bigint;
    v_why    text;
    v_fresh  boolean := pg_current_xact_id_if_assigned() IS NULL;
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
    -- An id drawn before the transaction had an xid (the column's identity
    -- draws it before this trigger runs) is drawn again, now that the
    -- counter's lock gave the transaction one: the relay's scan floor
    -- relies on every id being drawn by a transaction that already has its
    -- xid (migration 024).
    IF NEW.id IS NULL OR NEW.id <= v_top_id OR v_fresh THEN
        PERFORM pg_current_xact_id();
        NEW.id := nextval('onceflow.outbox_id_seq');
    END IF;
    RETURN NEW;
END
$function$;

DROP TABLE onceflow.source_seq_moves;
