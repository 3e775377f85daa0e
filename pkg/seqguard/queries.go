package seqguard

// The SQL of the Postgres store, in one place. Every table is
// schema-qualified.

const (
	// Create the seq_state rows a batch is about to lock (NULL last_applied:
	// not started), in source order.
	qEnsureState = `
INSERT INTO onceflow.seq_state (consumer, source, last_applied, updated_at)
SELECT $1::text, s, NULL::bigint, $3::timestamptz FROM unnest($2::text[]) AS s ORDER BY s
ON CONFLICT (consumer, source) DO NOTHING`

	// Lock the seq_state rows in source order (LockRows runs above the sort),
	// with the database's clock (the transaction's now()). It runs with a
	// custom plan (qCustomPlans), never a generic one: see there.
	qLockState = `
SELECT source, last_applied, first_seq, now() FROM onceflow.seq_state
WHERE consumer = $1 AND source = ANY($2::text[])
ORDER BY source
FOR UPDATE`

	// qCustomPlans and qRestorePlans bracket qLockState in Lock's round trip.
	// A prepared statement settles on a generic plan after five executions,
	// and a generic plan of qLockState is slow in two ways measured in the
	// consumer benchmarks: "source = ANY($2)" over a parameter array is a
	// linear search per row, so a table small enough for a sequential scan
	// (a few thousand sources) is filtered row by row against every source
	// of the batch (5 ms instead of 0.3 for 250 sources over 1000 rows, the
	// largest statement of a batch); and a generic plan made while the table
	// was nearly empty is kept while it grows (until the next autovacuum),
	// 12–80 ms per batch at 1000 sources. A custom plan sees the sources as
	// a constant (a hashed lookup in a sequential scan, or an index probe
	// per source) and the table's current size, for about 0.3 ms of
	// planning. Only this statement changes mode: the previous mode is put
	// back right after it (SET LOCAL semantics: it never outlives the
	// transaction).
	qCustomPlans = `
SELECT set_config('onceflow.seqguard_plan_cache_mode', current_setting('plan_cache_mode'), true),
       set_config('plan_cache_mode', 'force_custom_plan', true)`
	qRestorePlans = `
SELECT set_config('plan_cache_mode', current_setting('onceflow.seqguard_plan_cache_mode'), true)`

	// The timer's lock: one source, never waiting.
	qLockStateSkipLocked = `
SELECT source, last_applied, first_seq, now() FROM onceflow.seq_state
WHERE consumer = $1 AND source = $2
FOR UPDATE SKIP LOCKED`

	// The given-up ranges holding a seq at or below last_applied: the event
	// is late if there is one, a duplicate if not.
	qGivenUpAt = `
SELECT from_seq, to_seq, opened_at, deadline FROM onceflow.seq_gaps
WHERE consumer = $1 AND source = $2 AND state = 'given_up' AND from_seq <= $3 AND to_seq >= $3
ORDER BY from_seq`

	qDBNow = `SELECT now()`

	qLoadParked = `
SELECT source, seq FROM onceflow.inbox
WHERE consumer = $1 AND source = ANY($2::text[]) AND status = 'parked'
ORDER BY source, seq`

	qLoadGaps = `
SELECT source, from_seq, to_seq, opened_at, deadline FROM onceflow.seq_gaps
WHERE consumer = $1 AND source = ANY($2::text[]) AND state = 'open'
ORDER BY source, from_seq`

	// first_seq is written once, when the source starts ($5 NULL: unknown).
	qSaveState = `
UPDATE onceflow.seq_state SET last_applied = $3, updated_at = $4, first_seq = coalesce(first_seq, $5)
WHERE consumer = $1 AND source = $2`

	// Locked.Flush: the deferred last_applied of several sources at once.
	qSaveStates = `
UPDATE onceflow.seq_state s SET last_applied = u.last_applied, updated_at = $4,
    first_seq = coalesce(s.first_seq, nullif(u.first_seq, 0))
FROM unnest($2::text[], $3::bigint[], $5::bigint[]) AS u(source, last_applied, first_seq)
WHERE s.consumer = $1 AND s.source = u.source`

	// The received event's inbox row (inserted by the consumer) becomes
	// parked or held, keeping what is needed to apply it later. NULL headers
	// or payload leave the row's own (the caller may have written them).
	qPark = `
UPDATE onceflow.inbox
SET status = $3, late = $4, headers = coalesce($5, headers), payload = coalesce($6, payload), processed_at = NULL
WHERE consumer = $1 AND event_id = $2`

	qMarkLate = `
UPDATE onceflow.inbox SET late = true WHERE consumer = $1 AND event_id = $2`

	// Un-park: the rows become processed and drop their payload; the old
	// values are returned for the handler.
	qUnpark = `
WITH old AS (
    SELECT event_id, seq, event_type, topic, kafka_partition, kafka_offset, headers, payload
    FROM onceflow.inbox
    WHERE consumer = $1 AND source = $2 AND status = 'parked' AND seq = ANY($3::bigint[])
    FOR UPDATE
)
UPDATE onceflow.inbox i
SET status = 'processed', processed_at = $4, headers = NULL, payload = NULL
FROM old
WHERE i.consumer = $1 AND i.event_id = old.event_id
RETURNING old.event_id, old.seq, old.event_type, old.topic, old.kafka_partition, old.kafka_offset, old.headers, old.payload`

	qGapOpen = `
INSERT INTO onceflow.seq_gaps (consumer, source, from_seq, to_seq, opened_at, deadline)
VALUES ($1, $2, $3, $4, $5, $6)`

	qGapNarrow = `
UPDATE onceflow.seq_gaps SET from_seq = $5, to_seq = $6
WHERE consumer = $1 AND source = $2 AND state = 'open' AND from_seq = $3 AND to_seq = $4`

	qGapFill = `
UPDATE onceflow.seq_gaps SET state = 'filled', closed_at = $5
WHERE consumer = $1 AND source = $2 AND state = 'open' AND from_seq = $3 AND to_seq = $4`

	qGapGiveUp = `
UPDATE onceflow.seq_gaps SET state = 'given_up', give_up_reason = $5, closed_at = $6
WHERE consumer = $1 AND source = $2 AND state = 'open' AND from_seq = $3 AND to_seq = $4`

	// Sources with an expired open gap: candidates for the timer, read
	// without locks; each is then locked (SKIP LOCKED) and re-read.
	qExpiredSources = `
SELECT DISTINCT source FROM onceflow.seq_gaps
WHERE consumer = $1 AND state = 'open' AND deadline <= $2
ORDER BY source
LIMIT $3`

	qStats = `
SELECT
    (SELECT count(*) FROM onceflow.seq_gaps WHERE consumer = $1 AND state = 'open'),
    (SELECT min(opened_at) FROM onceflow.seq_gaps WHERE consumer = $1 AND state = 'open'),
    now(),
    (SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND status = 'parked'),
    (SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND status = 'held')`

	qListGaps = `
SELECT id, source, from_seq, to_seq, opened_at, deadline, state,
       coalesce(give_up_reason, ''), closed_at, resolved_at, coalesce(resolved_note, '')
FROM onceflow.seq_gaps
WHERE consumer = $1 AND (
    state = 'open'
    OR ($2 AND state = 'given_up' AND (resolved_at IS NULL OR closed_at >= $3)))
ORDER BY state = 'open' DESC, source, from_seq, id`

	qResolveGaps = `
UPDATE onceflow.seq_gaps SET resolved_at = $6, resolved_note = $5
WHERE consumer = $1 AND source = $2 AND state = 'given_up' AND resolved_at IS NULL
  AND from_seq >= $3 AND to_seq <= $4`
)
