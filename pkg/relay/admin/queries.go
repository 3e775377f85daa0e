package admin

import "github.com/onceflow/onceflow/pkg/relay/internal/identity"

const qIdentityAdopt = `
UPDATE onceflow.database_identity
   SET cluster_system_id = $1, database_oid = $2, changed_at = now(), changed_by = current_user,
       change_note = 'adopt: ' || $3
RETURNING ` + identity.QCols

const qIdentityReset = `
UPDATE onceflow.database_identity
   SET id = gen_random_uuid(), cluster_system_id = $1, database_oid = $2, first_used_at = NULL,
       changed_at = now(), changed_by = current_user, change_note = 'reset: ' || $3
RETURNING ` + identity.QCols

// Legacy checkpoints (legacy_v1.go).
const qLegacyList = `
SELECT shard, noted_at, decision, decided_at, decided_by, decision_note, settled_at, outcome
  FROM onceflow.relay_legacy_checkpoint ORDER BY shard`

const qLegacyDecide = `
UPDATE onceflow.relay_legacy_checkpoint SET decision = $2, decided_at = now(), decided_by = current_user, decision_note = $3
 WHERE shard = $1 AND settled_at IS NULL`

const qLegacySettleAll = `UPDATE onceflow.relay_legacy_checkpoint SET settled_at = now(), outcome = $1 WHERE settled_at IS NULL`

const qSetAsideCols = `a.outbox_id, a.event_id, a.topic, a.source, a.seq, a.event_type, a.reason, a.error, a.attempts,
       a.set_aside_at, a.last_failed_at, a.retry_at, a.retried_at, a.retried_by, a.resolved_at, a.resolution,
       a.resolved_by, a.note,
       (SELECT count(*) FROM onceflow.outbox_pending p JOIN onceflow.outbox o ON o.id = p.id
         WHERE o.source = a.source AND a.resolved_at IS NULL)`

// qSetAsideList lists open entries ($1 false) or all of them, newest
// first.
const qSetAsideList = `
SELECT ` + qSetAsideCols + `
  FROM onceflow.outbox_set_aside a
 WHERE $1 OR a.resolved_at IS NULL
 ORDER BY a.resolved_at IS NULL DESC, a.set_aside_at DESC, a.outbox_id`

const qSetAsideGet = `SELECT ` + qSetAsideCols + ` FROM onceflow.outbox_set_aside a WHERE a.outbox_id = $1`

// qSetAsideRetry makes the relay try an open entry's row at its next
// poll.
const qSetAsideRetry = `
UPDATE onceflow.outbox_set_aside
   SET retry_at = now(), retried_at = now(), retried_by = current_user, note = coalesce(nullif($2, ''), note)
 WHERE outbox_id = $1 AND resolved_at IS NULL`

// skipCopyMax bounds the values qSetAsideSkip copies into skipped_row
// (16 MiB).
const skipCopyMax = `16777216`

// qSetAsideSkip* run in one transaction: lock the open entry (refusing
// one whose retry is due: the relay may be publishing its row), copy and
// delete the outbox row, resolve the entry.
// "Due" is measured by the clock when the lock is held, not by the
// transaction's start (now()): a retry that came due while the skip's
// transaction waited or ran must refuse the skip, since the relay may have
// claimed the row (qSetAsideClaim) meanwhile.
const qSetAsideSkipLock = `
SELECT retry_at IS NOT NULL AND retry_at <= clock_timestamp()
  FROM onceflow.outbox_set_aside WHERE outbox_id = $1 AND resolved_at IS NULL FOR UPDATE`

// The copy is the whole row up to skipCopyMax bytes of payload, key and
// headers; a larger row (set aside as too large, possibly past what a jsonb
// value can hold) keeps its other columns, the sizes of those three and the
// payload's SHA-256.
const qSetAsideSkip = `
WITH d AS (
    DELETE FROM onceflow.outbox o
     WHERE o.id = $1 AND EXISTS (SELECT 1 FROM onceflow.outbox_pending p WHERE p.id = o.id)
    RETURNING CASE
        WHEN octet_length(o.payload)::bigint + coalesce(octet_length(o.record_key), 0) + octet_length(o.headers::text)
             <= ` + skipCopyMax + ` THEN to_jsonb(o.*)
        ELSE jsonb_build_object('id', o.id, 'event_id', left(o.event_id, 1000), 'topic', left(o.topic, 1000),
                 'source', left(o.source, 1000), 'seq', o.seq, 'event_type', left(o.event_type, 1000),
                 'content_type', left(o.content_type, 1000), 'created_at', o.created_at,
                 'payload_bytes', octet_length(o.payload), 'payload_sha256', encode(sha256(o.payload), 'hex'),
                 'record_key_bytes', octet_length(o.record_key), 'headers_bytes', octet_length(o.headers::text),
                 'omitted', 'payload, record_key and headers: over ' || ` + skipCopyMax + ` || ' bytes')
    END AS row
)
UPDATE onceflow.outbox_set_aside
   SET resolved_at = now(), resolution = 'skipped', resolved_by = current_user, note = $2,
       skipped_row = (SELECT row FROM d), retry_at = NULL
 WHERE outbox_id = $1 AND resolved_at IS NULL`

// Pruning by event class (ScanPublished, DeletePublished). The relay's own
// pruning (Config.Retention) deletes whole batches by age (qPrune). A row a
// class pruned stays named in its batch's log row until the relay prunes the
// batch; the join skips it.
const (
	// $1 published before, $2/$3 the cursor (published_at, id), $4 limit.
	qScanPublished = `
SELECT o.id, o.event_type, l.published_at
  FROM onceflow.outbox_published l
 CROSS JOIN LATERAL unnest(l.ids) AS u(id)
  JOIN onceflow.outbox o ON o.id = u.id
 WHERE l.published_at < $1 AND (l.published_at, u.id) > ($2, $3)
 ORDER BY l.published_at, u.id LIMIT $4`
	qDeletePublishedIDs = `
DELETE FROM onceflow.outbox o
 WHERE o.id = ANY($1) AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_pending p WHERE p.id = o.id)`
)
