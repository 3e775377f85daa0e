package inbox

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// Every statement the inbox runs, in one place. All tables are
// schema-qualified.

// qLockKeys takes the transaction advisory lock of each of a batch's keys
// ($2) of consumer $1, in one order (no two batches deadlock on them). The
// inbox's unique key holds the partition key (lane, event_at) as well, so
// two copies of one event id inserted at once into different buckets would
// both be new: the lock makes the second wait for the first's commit, and
// its dedup probe (a statement that starts after the lock is granted) then
// sees the first's row. The locks' class, x'0e1b', is the inbox's.
const qLockKeys = `
SELECT pg_advisory_xact_lock(x'0e1b'::integer, s.h)
FROM (SELECT DISTINCT hashtext($1 || E'\n' || k) AS h FROM unnest($2::text[]) AS k ORDER BY 1 OFFSET 0) AS s`

// withLanes writes the partitions a dedup probe covers into a statement:
// "{probe x}" becomes "(x.lane = 'l1' AND x.consumer = $1 OR ...)" for each
// lane, constants the planner prunes the other lanes' partitions with, and
// each arm with both keys. PostgreSQL factors the common "consumer = $1"
// out of the arms, and the lane alone (the first column of the partition
// key) prunes only the other lanes: the same lanes' partitions of every
// other consumer name are read too. "{lookup e f}" is the look-up of one
// id, the expression e, as a subquery of one arm per lane, each with lane and
// consumer side by side (UNION ALL, LIMIT 1: the first arm that has it
// ends the look-up), which prunes to the consumer's own partitions of the
// lane; the batch probes use it. Every lane but legacy has two arms: rows
// with event_at >= f, the batch's floor (batchFloor: the least of its
// keys' probe bounds, probeBound), and rows older than since (written
// before the constraint inbox_id_time took effect; no such arm when since
// is minus infinity). f is a parameter, a constant to the planner of an
// unnamed statement (probeMode), and since a constant: the buckets outside
// both are pruned when the statement is planned, so it neither plans nor
// locks them (a bucket that retention is truncating does not hold up a
// batch of new UUIDv7 ids). A bound per key would prune more for a batch
// of mixed ages, but PostgreSQL then prunes again for every key and arm as
// the statement runs, at a cost that grows with the parent's partitions
// (of every consumer name): 9 ms a batch of 500 beside 20 other consumer
// names, a drain at 0.84 of a database of its own against 0.92 without
// (docs/performance.md). $1 is the consumer in every statement
// that has a probe. The lanes come from onceflow.inbox_lane, which makes
// only these forms.
func withLanes(q string, lanes []string, since pgtype.Timestamptz) (string, error) {
	for _, l := range lanes {
		if !laneName.MatchString(l) {
			return "", fmt.Errorf("inbox: lane %q is not a lane name", l)
		}
	}
	for _, alias := range []string{"i", "k", "o"} {
		arms := make([]string, len(lanes))
		for j, l := range lanes {
			arms[j] = fmt.Sprintf("%s.lane = '%s' AND %s.consumer = $1", alias, l, alias)
		}
		q = strings.ReplaceAll(q, "{probe "+alias+"}", "("+strings.Join(arms, " OR ")+")")
	}
	var err error
	q = lookup.ReplaceAllStringFunc(q, func(m string) string {
		sub := lookup.FindStringSubmatch(m)
		id, floor := sub[1], sub[2]
		if len(lanes) == 0 {
			err = fmt.Errorf("inbox: a look-up needs at least one lane")
			return m
		}
		before := sinceLiteral(since)
		var arms []string
		for _, l := range lanes {
			arm := lookupArm(l, id)
			if l == laneLegacy {
				arms = append(arms, arm)
				continue
			}
			arms = append(arms, arm+" AND x.event_at >= "+floor)
			if before != "" {
				arms = append(arms, arm+" AND x.event_at < "+before)
			}
		}
		return "(" + strings.Join(arms, " UNION ALL ") + " LIMIT 1)"
	})
	return q, err
}

// insertStatement is qInsertBatch for the consumer's probe lanes: its
// dedup probe looks the dirty keys ($16) up as withLanes does, and the
// clean ones ($17) outside the lanes' sealed buckets (sealedSet.
// cleanLookup). A side with no key is written without its look-up, so
// that its partitions are neither planned nor locked.
func insertStatement(lanes []string, since pgtype.Timestamptz, sealed sealedSet, dirty, clean bool) (string, error) {
	dirtyPart := `SELECT b.event_id FROM unnest($16::text[]) AS b(event_id) WHERE $15::timestamptz IS NULL AND false`
	if dirty {
		dirtyPart = `SELECT b.event_id FROM unnest($16::text[]) AS b(event_id)
    CROSS JOIN LATERAL {lookup b.event_id $15::timestamptz} AS k`
	}
	cleanPart := `SELECT b.event_id FROM unnest($17::text[]) AS b(event_id) WHERE false`
	if clean {
		cleanPart = `SELECT b.event_id FROM unnest($17::text[]) AS b(event_id)
    CROSS JOIN LATERAL ` + sealed.cleanLookup("b.event_id", lanes) + ` AS k`
	}
	return withLanes(strings.Replace(qInsertBatch, "{known}", dirtyPart+"\n    UNION ALL\n    "+cleanPart, 1), lanes, since)
}

// lookupArm is one lane's arm of a look-up of the id expression id: lane
// and consumer side by side, so that only the consumer's partitions of the
// lane are planned. Callers add the arm's time bounds.
func lookupArm(lane, id string) string {
	return fmt.Sprintf("SELECT 1 FROM onceflow.inbox x WHERE x.lane = '%s' AND x.consumer = $1 AND x.event_id = %s", lane, id)
}

var lookup = regexp.MustCompile(`\{lookup ([a-z_]+\.[a-z_]+) (\$[0-9]+::timestamptz)\}`)

var laneName = regexp.MustCompile(`^(legacy|permanent|ttl-[0-9]+s)$`)

// qInsertBatch inserts the inbox rows of a batch's valid events (each key
// once) in offset order; RETURNING names the ones that were new. A key the
// inbox has in any partition of the consumer's lanes (see withLanes) is
// not inserted: the partitions' unique key holds the lane and
// the time bucket too, so it cannot tell alone. $13 is each event's lane,
// $14 each key's id floor (idFloor): a row whose floor is after the
// transaction's time goes to the legacy lane (the constraint
// inbox_id_time); $16 the keys probed with the batch's floor $15
// (batchFloor of $16), $17 the clean keys, probed outside the sealed
// buckets (insertStatement, sealed.go); event_at takes the
// transaction's time (its bucket). The
// same statement stores the partition's next offset and the topic ID it
// belongs to (one round trip less per batch; it commits or rolls back with
// everything else). A row of another topic ID is replaced. Run after
// qLockKeys.
const qInsertBatch = `
WITH next_offset AS (
    INSERT INTO onceflow.consumer_offsets (group_id, topic, kafka_partition, next_offset, topic_id, updated_at)
    VALUES ($9, $2, $3, $10, $11, now())
    ON CONFLICT (group_id, topic, kafka_partition)
    DO UPDATE SET next_offset = EXCLUDED.next_offset, topic_id = EXCLUDED.topic_id, updated_at = now()
), known AS (
    {known}
)
INSERT INTO onceflow.inbox
    (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at, producer, lane)
SELECT $1, e.event_id, e.source, e.seq, e.event_type, $2, $3, e.kafka_offset, 'processed', now(), e.producer,
       CASE WHEN e.floor > now() THEN 'legacy' ELSE e.lane END
FROM unnest($4::text[], $5::text[], $6::bigint[], $7::text[], $8::bigint[], $12::text[], $13::text[], $14::timestamptz[])
    AS e(event_id, source, seq, event_type, kafka_offset, producer, lane, floor)
WHERE NOT EXISTS (SELECT 1 FROM known WHERE known.event_id = e.event_id)
ON CONFLICT DO NOTHING
RETURNING event_id, lane`

// qKnown counts which of a batch's keys the inbox already has (committed
// rows only), in the consumer's lanes: the read-only fast path for a batch of
// redeliveries. $3 is the least of the keys' probe bounds (batchFloor).
// (A malformed
// record dead-lettered under the older key form is not known here; the
// transaction's qInsertDead finds it.)
const qKnown = `
SELECT count(*) FROM (SELECT DISTINCT b.event_id FROM unnest($2::text[]) AS b(event_id)) AS b
CROSS JOIN LATERAL {lookup b.event_id $3::timestamptz} AS i`

// qInsertDead records a dead letter (a malformed record, or an event whose
// handler kept failing), keeping headers and payload for replay, in the
// legacy lane (a dead row is kept until an operator replays or deletes
// it). $13, when not NULL, is the older-form key of a malformed record: a
// row under it with the same headers and payload is this record's, which
// is then a duplicate (nothing inserted). A row of the key in any of the
// consumer's lanes (withLanes) makes it a duplicate too. Run after qLockKeys of the key.
const qInsertDead = `
INSERT INTO onceflow.inbox
    (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset,
     status, attempts, last_error, headers, payload, producer, lane)
SELECT $1::text, $2::text, $3::text, $4::bigint, $5::text, $6::text, $7::integer, $8::bigint,
    'dead', $9::integer, $10::text, $11::jsonb, $12::bytea, $14::text, 'legacy'
WHERE NOT EXISTS (SELECT 1 FROM onceflow.inbox k WHERE {probe k} AND k.event_id = $2)
  AND ($13::text IS NULL OR NOT EXISTS (
    SELECT 1 FROM onceflow.inbox o
    WHERE {probe o} AND o.event_id = $13
      AND o.headers IS NOT DISTINCT FROM $11::jsonb AND coalesce(o.payload, ''::bytea) = coalesce($12::bytea, ''::bytea)))
ON CONFLICT DO NOTHING
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
INSERT INTO onceflow.consumer_offsets (group_id, topic, kafka_partition, next_offset, topic_id, updated_at)
VALUES ($1, $2, $3, $4, $5, now())
ON CONFLICT (group_id, topic, kafka_partition)
DO UPDATE SET next_offset = EXCLUDED.next_offset, topic_id = EXCLUDED.topic_id, updated_at = now()`

// qLoadOffsets reads the stored next offsets of a group's topics.
const qLoadOffsets = `
SELECT topic, kafka_partition, next_offset, topic_id
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

// qHasSeqState reports whether the sequence guard tracks a stream.
const qHasSeqState = `
SELECT EXISTS (SELECT 1 FROM onceflow.seq_state WHERE consumer = $1 AND source = $2 AND producer = $3 AND topic = $4)`

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
WHERE consumer = $1 AND source = $2 AND producer = $6 AND topic = $7
  AND from_seq = $3 AND to_seq = $4 AND state = 'given_up' AND trace_ids IS NULL`

// Dead-letter search and grouping (dlqfilter.go). The error key and the
// group id are computed here and nowhere else; docs/console.md states the
// rule in words. The key of a row is its last_error with every word (a
// maximal run of letters, digits, '_', '-' and '.') that contains a digit
// replaced by '#', except the five-character code after "SQLSTATE ";
// whitespace runs collapsed to one space; cut to 240 characters.
const (
	qErrorKey = `left(btrim(regexp_replace(regexp_replace(coalesce(i.last_error, ''),
        '(?<![[:alnum:]_.-])(?<!SQLSTATE )[[:alnum:]_.-]*[0-9][[:alnum:]_.-]*', '#', 'g'),
        '\s+', ' ', 'g')), 240)`
	qGroupID = `left(md5(i.status || ' ' || ` + qErrorKey + `), 12)`

	// $1 consumer, $2 statuses, $3 event type LIKE pattern, $4 source,
	// $5 error substring (case-insensitive), $6 received from, $7 received
	// to (exclusive), $8 group id, $9 event ids. NULL skips a condition.
	qDeadWhere = `
FROM onceflow.inbox i
WHERE i.consumer = $1 AND i.status = ANY($2::text[])
  AND ($3::text IS NULL OR i.event_type LIKE $3)
  AND ($4::text IS NULL OR i.source = $4)
  AND ($5::text IS NULL OR strpos(lower(coalesce(i.last_error, '')), lower($5)) > 0)
  AND ($6::timestamptz IS NULL OR i.received_at >= $6)
  AND ($7::timestamptz IS NULL OR i.received_at < $7)
  AND ($8::text IS NULL OR ` + qGroupID + ` = $8)
  AND ($9::text[] IS NULL OR i.event_id = ANY($9))`

	qDeadColumns = `
SELECT i.event_id, i.status, i.source, i.seq, i.event_type, i.topic, i.kafka_partition, i.kafka_offset,
       i.attempts, coalesce(i.last_error, ''), i.received_at, ` + qErrorKey + `, ` + qGroupID + `,
       coalesce(split_part(i.headers->>'traceparent', '-', 2), '')`

	// qFindDead lists matching rows oldest first; $10 is the limit.
	qFindDead = qDeadColumns + qDeadWhere + `
ORDER BY i.received_at, i.event_id
LIMIT $10`

	// qFindDeadReplayOrder lists matching rows in the order a bulk replay
	// applies them: per source by seq (rows without a seq, malformed
	// records, last), then by arrival.
	qFindDeadReplayOrder = qDeadColumns + qDeadWhere + `
ORDER BY i.source, i.seq NULLS LAST, i.received_at, i.event_id
LIMIT $10`

	qCountDead = `
SELECT count(*), count(DISTINCT i.source)` + qDeadWhere

	// qGroupDead groups matching rows by status and error key, biggest
	// first; $10 is the limit.
	qGroupDead = `
WITH d AS (
    SELECT i.status, i.event_type, i.source, coalesce(i.last_error, '') AS last_error, i.received_at,
           ` + qErrorKey + ` AS key` + qDeadWhere + `
)
SELECT left(md5(d.status || ' ' || d.key), 12), d.status, d.key,
       (array_agg(d.last_error ORDER BY d.received_at DESC))[1],
       count(*), (array_agg(DISTINCT d.event_type))[1:10], count(DISTINCT d.source),
       min(d.received_at), max(d.received_at)
FROM d
GROUP BY d.status, d.key
ORDER BY count(*) DESC, d.key, d.status
LIMIT $10`
)
