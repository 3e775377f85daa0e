package outbox

// The statements Enqueue and EnqueueBatch run. Every table is
// schema-qualified.

// qEnqueue inserts one outbox row naming its seq, as qEnqueueBatch does:
// onceflow.next_seqs locks the stream's (source, topic) counter row until
// the producer's transaction ends and returns the stream's next seq, so
// producers of one stream serialize, seqs are gap-free per stream (a
// rollback burns nothing; the trigger outbox_check_seq checks the seq and
// moves the counter at the end of the statement) and, per stream, id order
// is seq order. The row trigger outbox_assign_seq does not run: on the
// partitioned outbox (migration 034) its look-up of the statement's
// earlier rows reads every partition. The counter's row lock gives the
// transaction its xid before the row's id is drawn, as the relay's scan
// floor requires (migration 024).
const qEnqueue = `
WITH s AS MATERIALIZED (SELECT n.next_seq FROM onceflow.next_seqs(ARRAY[$3::text], ARRAY[$2::text]) AS n)
INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload)
SELECT coalesce($1, gen_random_uuid()::text), $2::text, $3::text, s.next_seq, $4::text, $5::text, $6::bytea, $7::jsonb, $8::bytea FROM s
RETURNING event_id, seq`

// qEnqueueBatch is qEnqueue for a whole batch in one statement, without a
// trigger call per row: onceflow.next_seqs locks the counters of the batch's
// streams in (source, topic) order (the lock order, so that batches cannot
// deadlock each other) and returns each stream's next seq; the messages of a
// stream take the seqs that follow in their order in the batch, and rows are
// inserted sorted by source, topic, then position, so that per stream id
// order is seq order. The trigger outbox_check_seq checks the seqs and moves
// the counters. It returns each stream's first seq, from which the caller
// knows every message's seq.
// $1 event ids, $2 topics, $3 sources, $4 event types, $5 content types,
// $6 record keys (NULL: the source), $7 headers (JSON text), $8 payloads.
const qEnqueueBatch = `
WITH m AS (
    SELECT m.*, row_number() OVER (PARTITION BY m.source, m.topic ORDER BY m.ord) - 1 AS k
      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::bytea[])
           WITH ORDINALITY AS m(event_id, topic, source, event_type, content_type, record_key, headers, payload, ord)
), s AS (
    SELECT n.source, n.topic, n.next_seq
      FROM (SELECT array_agg(d.source) AS sources, array_agg(d.topic) AS topics
              FROM (SELECT DISTINCT source, topic FROM m) d) a
     CROSS JOIN LATERAL onceflow.next_seqs(a.sources, a.topics) n
), ins AS (
    INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload)
    SELECT m.event_id, m.topic, m.source, s.next_seq + m.k,
           m.event_type, m.content_type, m.record_key, m.headers::jsonb, m.payload
      FROM m JOIN s USING (source, topic)
     ORDER BY m.source, m.topic, m.ord
)
SELECT source, topic, next_seq FROM s`
