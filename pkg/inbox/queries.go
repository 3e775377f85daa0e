package inbox

// Every statement the inbox runs, in one place. All tables are
// schema-qualified.

// qInsertBatch inserts the inbox rows of a batch's valid events in offset
// order; RETURNING names the ones that were new. A key repeated inside the
// batch conflicts with its own first copy and is not returned twice. The
// same statement stores the partition's next offset (one round trip less per
// batch; it commits or rolls back with everything else).
const qInsertBatch = `
WITH next_offset AS (
    INSERT INTO onceflow.consumer_offsets (group_id, topic, kafka_partition, next_offset, updated_at)
    VALUES ($9, $2, $3, $10, now())
    ON CONFLICT (group_id, topic, kafka_partition)
    DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()
)
INSERT INTO onceflow.inbox
    (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at)
SELECT $1, e.event_id, e.source, e.seq, e.event_type, $2, $3, e.kafka_offset, 'processed', now()
FROM unnest($4::text[], $5::text[], $6::bigint[], $7::text[], $8::bigint[])
    AS e(event_id, source, seq, event_type, kafka_offset)
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING event_id`

// qKnown finds which of a batch's keys the inbox already has (committed
// rows only): the read-only fast path for a batch of redeliveries.
const qKnown = `
SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND event_id = ANY($2::text[])`

// qInsertDead records a dead letter (a malformed record, or an event whose
// handler kept failing), keeping headers and payload for replay.
const qInsertDead = `
INSERT INTO onceflow.inbox
    (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset,
     status, attempts, last_error, headers, payload)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'dead', $9, $10, $11, $12)
ON CONFLICT (consumer, event_id) DO NOTHING
RETURNING event_id`

// qMarkApplied marks a replayed row processed and drops
// what was kept for it.
const qMarkApplied = `
UPDATE onceflow.inbox
SET status = 'processed', processed_at = now(), late = $3, last_error = NULL, headers = NULL, payload = NULL
WHERE consumer = $1 AND event_id = $2`

// qStoreOffset records the partition's next offset in a dead-letter
// transaction.
const qStoreOffset = `
INSERT INTO onceflow.consumer_offsets (group_id, topic, kafka_partition, next_offset, updated_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (group_id, topic, kafka_partition)
DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()`

// qLoadOffsets reads the stored next offsets of a group's topics.
const qLoadOffsets = `
SELECT topic, kafka_partition, next_offset
FROM onceflow.consumer_offsets
WHERE group_id = $1 AND topic = ANY($2::text[])`

// qLockForReplay locks one row for a replay.
const qLockForReplay = `
SELECT status, source, seq, event_type, topic, kafka_partition, kafka_offset, attempts,
       coalesce(headers, '{}'::jsonb), coalesce(payload, ''::bytea), received_at
FROM onceflow.inbox
WHERE consumer = $1 AND event_id = $2
FOR UPDATE`

// qReplayFailed records a failed replay attempt.
const qReplayFailed = `
UPDATE onceflow.inbox SET attempts = attempts + 1, last_error = $3
WHERE consumer = $1 AND event_id = $2`

// qListAttention lists dead and held rows, oldest first.
const qListAttention = `
SELECT event_id, status, source, seq, event_type, topic, kafka_partition, kafka_offset,
       attempts, coalesce(last_error, ''), received_at,
       coalesce(split_part(headers->>'traceparent', '-', 2), '')
FROM onceflow.inbox
WHERE consumer = $1 AND status = ANY($2::text[])
ORDER BY received_at, event_id
LIMIT $3`

// qHasSeqState reports whether the sequence guard tracks a source.
const qHasSeqState = `
SELECT EXISTS (SELECT 1 FROM onceflow.seq_state WHERE consumer = $1 AND source = $2)`

// qReplayAdmit makes a dead row look like a just-inserted one before the
// sequence guard sees it (it keeps headers and payload for parking).
const qReplayAdmit = `
UPDATE onceflow.inbox SET status = 'processed', processed_at = now()
WHERE consumer = $1 AND event_id = $2`

// qReleasedDead dead-letters a released parked event whose handler kept
// failing in the gap timer; headers and payload are kept again for replay.
const qReleasedDead = `
UPDATE onceflow.inbox
SET status = 'dead', processed_at = NULL, attempts = $3, last_error = $4, headers = $5, payload = $6
WHERE consumer = $1 AND event_id = $2`

// qGapTraceIDs records the trace ids of the events a given-up gap involved
// (the events that waited behind it).
const qGapTraceIDs = `
UPDATE onceflow.seq_gaps SET trace_ids = $5
WHERE consumer = $1 AND source = $2 AND from_seq = $3 AND to_seq = $4 AND state = 'given_up' AND trace_ids IS NULL`
