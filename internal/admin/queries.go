package admin

// Every statement of the admin package. All tables are schema-qualified.

const (
	// qClaim records a new request; no row comes back when the request id
	// is known (after waiting for a concurrent claim of it to end).
	qClaim = `
INSERT INTO onceflow.admin_audit (request_id, consumer, action, actor, via, params, note, outcome)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'running')
ON CONFLICT (request_id) DO NOTHING
RETURNING id`

	// qStored reads a known request, and whether it asked for the same.
	qStored = `
SELECT id, consumer = $2 AND action = $3 AND params = $4::jsonb, outcome, coalesce(result, 'null'::jsonb)
FROM onceflow.admin_audit
WHERE request_id = $1`

	qFinish = `
UPDATE onceflow.admin_audit SET outcome = $2, result = $3, finished_at = now()
WHERE id = $1 AND outcome = 'running'`

	// qClaimIntent records a new request and its intent ($8) in the result
	// until the outcome replaces it; no row comes back when the id is known.
	qClaimIntent = `
INSERT INTO onceflow.admin_audit (request_id, consumer, action, actor, via, params, note, outcome, result)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'running', $8)
ON CONFLICT (request_id) DO NOTHING
RETURNING id`

	// qLockRequest and qUnlockRequest: a session lock on a request id, held
	// while a change runs in transactions of its own (runCommitted).
	qLockRequest   = `SELECT pg_advisory_lock(1869570662, hashtext($1))`
	qUnlockRequest = `SELECT pg_advisory_unlock(1869570662, hashtext($1))`

	// qInterrupted finishes a request whose session ended part-way: its
	// intent, with the error.
	qInterrupted = `
UPDATE onceflow.admin_audit
   SET outcome = 'error',
       result = coalesce(result, '{}'::jsonb) || jsonb_build_object('error', $2::text, 'error_kind', 'interrupted', 'request_id', request_id)
 WHERE id = $1 AND outcome = 'running'
RETURNING result`

	// qAudit lists recent changes, without the per-event lists of replays.
	qAudit = `
SELECT id, request_id, consumer, action, actor, via, params, note, outcome,
       coalesce(result - 'events', 'null'::jsonb), created_at, finished_at
FROM onceflow.admin_audit
WHERE consumer = $1
ORDER BY created_at DESC, id DESC
LIMIT $2`

	qSummary = `
SELECT
    (SELECT count(*) FROM onceflow.seq_gaps WHERE consumer = $1 AND state = 'open'),
    (SELECT count(*) FROM onceflow.seq_gaps WHERE consumer = $1 AND state = 'given_up' AND resolved_at IS NULL),
    (SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND status = 'dead'),
    (SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND status = 'held'),
    (SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND status = 'parked'),
    now()`

	qStoredOffsets = `
SELECT topic, kafka_partition, next_offset, updated_at
FROM onceflow.consumer_offsets
WHERE group_id = $1 AND topic = ANY($2::text[])
ORDER BY topic, kafka_partition`

	qRelayStatus = `
SELECT pending_rows, oldest_unpublished_at, db_now, leases FROM onceflow.relay_status()`

	// qRelaySetAside lists the open set-aside outbox rows, oldest first,
	// with their total, through onceflow.relay_set_aside() (identity,
	// reason and error; never a payload).
	qRelaySetAside = `
SELECT outbox_id, event_id, topic, source, seq, event_type, reason, error, attempts,
       set_aside_at, last_failed_at, retry_at, total
  FROM onceflow.relay_set_aside($1)`
)
