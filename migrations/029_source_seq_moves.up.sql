-- A stream's counter moves without leaving row versions behind.
--
-- Every statement that enqueued moved its streams' counters by an UPDATE of
-- onceflow.source_seq. Each UPDATE leaves a row version that vacuum cannot
-- remove while an old snapshot is held (an idle-in-transaction session, a
-- long report, a replication slot), and every later lock of the counter
-- walks all of them: with one REPEATABLE READ snapshot held, an enqueue on
-- ten streams fell from about 900 to about 50 per second after 68k events.
--
-- Now a move inserts the new value into onceflow.source_seq_moves and
-- deletes the previous one by its exact key: a reader takes the stream's
-- newest move (a backward index scan that stops at the first, newest, live
-- entry), and the delete finds its one entry by key, so neither visits the
-- versions an old snapshot keeps. onceflow.source_seq keeps the lock (its
-- rows are locked, no longer updated per statement), and its last_seq stays
-- a floor that an operator may still raise (docs/relay.md, "Restored or
-- copied databases"): a stream's last seq is the greater of the two. The
-- functions that read or move the counters run with their owner's rights,
-- as before; no role gets anything on the new table.
CREATE TABLE onceflow.source_seq_moves (
    source   text   NOT NULL,
    topic    text   NOT NULL,
    last_seq bigint NOT NULL CHECK (last_seq >= 0),
    PRIMARY KEY (source, topic, last_seq)
);
COMMENT ON TABLE onceflow.source_seq_moves IS
    'Each stream''s counter as it moves (one live row per stream); the stream''s last seq is greatest(source_seq.last_seq, max(source_seq_moves.last_seq)).';
REVOKE ALL ON onceflow.source_seq_moves FROM PUBLIC;

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
        -- The counter's newest move (migration 029).
        v_last := greatest(v_last, coalesce((SELECT m.last_seq FROM onceflow.source_seq_moves m
                          WHERE m.source = r.s AND m.topic = r.t
                          ORDER BY m.last_seq DESC LIMIT 1), 0));
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
    v_moved bigint;
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
        -- The counter's newest move (migration 029): the stream's last seq is
        -- the greater of it and the locked row's value.
        SELECT m.last_seq INTO v_moved FROM onceflow.source_seq_moves m
         WHERE m.source = r.source AND m.topic = r.topic
         ORDER BY m.last_seq DESC LIMIT 1;
        v_last := greatest(v_last, v_moved);
        SELECT o.id INTO v_prev FROM onceflow.outbox o
         WHERE o.source = r.source AND o.topic = r.topic AND o.seq = v_last;
        IF r.lo <> v_last + 1 OR NOT r.in_order OR v_prev >= r.first_id THEN
            RAISE EXCEPTION 'onceflow.outbox: source % on topic %: the rows carry seqs % to %, but the stream''s next seqs are % on, in id order',
                quote_literal(r.source), quote_literal(r.topic), r.lo, r.hi, v_last + 1
                USING ERRCODE = '23514',
                      HINT = 'Leave seq out: the database gives each row its seq (onceflow.next_seqs tells a batch its seqs).';
        END IF;
        -- Move the counter: the new value in, the previous move out by its
        -- exact key. The row in source_seq is only locked, never updated.
        INSERT INTO onceflow.source_seq_moves (source, topic, last_seq) VALUES (r.source, r.topic, r.hi);
        IF v_moved IS NOT NULL THEN
            DELETE FROM onceflow.source_seq_moves m
             WHERE m.source = r.source AND m.topic = r.topic AND m.last_seq = v_moved;
        END IF;
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
    v_last := greatest(v_last, coalesce((SELECT m.last_seq FROM onceflow.source_seq_moves m
                          WHERE m.source = NEW.source AND m.topic = NEW.topic
                          ORDER BY m.last_seq DESC LIMIT 1), 0));
    -- Only rows above the counter can be this statement's: the bound keeps
    -- the walk off the entries of rows deleted (published and pruned, or
    -- -delete-on-publish) that an old snapshot keeps in the index.
    SELECT o.seq, o.id INTO v_top, v_top_id FROM onceflow.outbox o
     WHERE o.source = NEW.source AND o.topic = NEW.topic AND o.seq > v_last
     ORDER BY o.seq DESC
     LIMIT 1;
    IF NOT FOUND THEN
        -- The row holding the counter's seq (gone once deleted): the new
        -- row's id must come after its id, as onceflow.outbox_check_seq
        -- checks.
        SELECT o.id INTO v_top_id FROM onceflow.outbox o
         WHERE o.source = NEW.source AND o.topic = NEW.topic AND o.seq = v_last;
    END IF;
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

-- The newest move is found by walking the primary key backwards from the
-- stream's top: the first live entry ends the walk. The planner does not
-- know that. Its statistics count the live rows (one per stream) and not
-- the deleted entries a held snapshot keeps, so it expects one row either
-- way and may prefer a bitmap scan of the stream's whole key range and a
-- sort, which reads every kept entry and its heap page (measured: 550
-- buffers per look-up after 65k moves under one snapshot, against 3 for
-- the walk). Every query of these functions is a key look-up, so they run
-- with bitmap and sequential scans off: the walk is then the only plan
-- without a sort, and the one chosen.
ALTER FUNCTION onceflow.next_seqs(text[], text[]) SET enable_bitmapscan = off;
ALTER FUNCTION onceflow.next_seqs(text[], text[]) SET enable_seqscan = off;
ALTER FUNCTION onceflow.outbox_check_seq() SET enable_bitmapscan = off;
ALTER FUNCTION onceflow.outbox_check_seq() SET enable_seqscan = off;
ALTER FUNCTION onceflow.outbox_assign_seq() SET enable_bitmapscan = off;
ALTER FUNCTION onceflow.outbox_assign_seq() SET enable_seqscan = off;
