package seqguard

import (
	"fmt"
	"slices"
	"strings"
)

// The SQL of the Postgres store, in one place. Every table is
// schema-qualified.
//
// A stream is (source, producer, topic); a legacy stream has producer and
// topic ''. Statements on several streams take them as three parallel
// arrays $2 (sources), $3 (producers), $4 (topics). Parked events are inbox
// rows: those of a stream are the rows of its source and producer and, for
// a non-legacy stream, its topic (a legacy stream's parked rows may come
// from any topic).

const (
	// Create the seq_state rows a batch is about to lock (NULL last_applied:
	// not started), in stream order.
	qEnsureState = `
INSERT INTO onceflow.seq_state (consumer, source, producer, topic, last_applied, updated_at)
SELECT $1::text, k.source, k.producer, k.topic, NULL::bigint, $5::timestamptz
FROM unnest($2::text[], $3::text[], $4::text[]) AS k(source, producer, topic)
ORDER BY k.source, k.producer, k.topic
ON CONFLICT (consumer, source, producer, topic) DO NOTHING`

	// Lock the seq_state rows in stream order (LockRows runs above the
	// sort). The rows are only locked: the state is read by the next
	// statement (qReadState), which takes its snapshot after every lock is
	// held, so it sees what the transactions it waited for committed (a
	// stream's last_applied lives in seq_applied too, which a FOR UPDATE of
	// seq_state would read as of before the wait). It runs with a custom
	// plan (qCustomPlans), never a generic one: see there.
	//
	// Each stream's row is found by its key, one stream after another in
	// stream order (the LIMIT keeps the look-up a step of a nested loop over
	// the sorted streams, which the planner cannot turn into a join). As a
	// join of the streams to seq_state, the lock was planned, with the
	// statistics of a table that grew since its last analyze (a fresh
	// consumer's drain), as a hash join over every row of the consumer even
	// with a custom plan: 20,000 rows read to lock 250 (session 14).
	qLockState = `
SELECT s.source
FROM (SELECT * FROM unnest($2::text[], $3::text[], $4::text[]) AS k(source, producer, topic)
      ORDER BY k.source, k.producer, k.topic) AS k
CROSS JOIN LATERAL (
    SELECT s.source FROM onceflow.seq_state s
    WHERE s.consumer = $1 AND s.source = k.source AND s.producer = k.producer AND s.topic = k.topic
    LIMIT 1
    FOR UPDATE) AS s`

	// The locked streams' state, with the database's clock (the
	// transaction's now()). A stream's last_applied is the greater of
	// seq_state's floor and its newest seq_applied row. For a stream that has
	// not started (neither) of a producer, the last two columns are its
	// source's legacy state, which the stream adopts if its first event is
	// above it (docs/seqguard.md, "Streams and the upgrade"); the CASE reads
	// the legacy rows only for such a stream. The streams' rows are found
	// by key, as in qLockState.
	qReadState = `
SELECT s.source, s.producer, s.topic, greatest(s.last_applied, a.last_applied), s.first_seq, now(),
    CASE WHEN s.last_applied IS NULL AND a.last_applied IS NULL AND s.producer <> '' THEN (
        SELECT greatest(l.last_applied, (SELECT la.last_applied FROM onceflow.seq_applied la
                WHERE la.consumer = l.consumer AND la.source = l.source AND la.producer = '' AND la.topic = ''
                ORDER BY la.last_applied DESC LIMIT 1))
        FROM onceflow.seq_state l
        WHERE l.consumer = s.consumer AND l.source = s.source AND l.producer = '' AND l.topic = '') END,
    CASE WHEN s.last_applied IS NULL AND a.last_applied IS NULL AND s.producer <> '' THEN (
        SELECT l.first_seq FROM onceflow.seq_state l
        WHERE l.consumer = s.consumer AND l.source = s.source AND l.producer = '' AND l.topic = '') END
FROM (SELECT * FROM unnest($2::text[], $3::text[], $4::text[]) AS k(source, producer, topic)
      ORDER BY k.source, k.producer, k.topic) AS k
CROSS JOIN LATERAL (
    SELECT s.consumer, s.source, s.producer, s.topic, s.last_applied, s.first_seq FROM onceflow.seq_state s
    WHERE s.consumer = $1 AND s.source = k.source AND s.producer = k.producer AND s.topic = k.topic
    LIMIT 1) AS s
CROSS JOIN LATERAL (` + qAppliedOf + `) a
ORDER BY s.source, s.producer, s.topic`

	// qAppliedOf is the newest last_applied of seq_state row s in
	// seq_applied (NULL: none): a backward scan of the primary key that stops
	// at the first live entry, whatever an old snapshot keeps behind it
	// (with qWalkPlans in force; ORDER BY … LIMIT 1 rather than max(), so
	// that a forward scan would need a sort and is never the cheaper plan).
	qAppliedOf = `SELECT (SELECT x.last_applied FROM onceflow.seq_applied x
    WHERE x.consumer = s.consumer AND x.source = s.source AND x.producer = s.producer AND x.topic = s.topic
    ORDER BY x.last_applied DESC LIMIT 1) AS last_applied`

	// qCustomPlans and qRestorePlans bracket qLockState in Lock's round trip.
	// A prepared statement settles on a generic plan after five executions,
	// and a generic plan of the lock was measured slow in the consumer
	// benchmarks, when it filtered by "source = ANY($2)": over a parameter
	// array that is a linear search per row, so a table small enough for a
	// sequential scan (a few thousand sources) was filtered row by row
	// against every source of the batch (5 ms instead of 0.3 for 250
	// sources over 1000 rows, the largest statement of a batch); and a
	// generic plan made while the table was nearly empty is kept while it
	// grows (until the next autovacuum), 12–80 ms per batch at 1000
	// sources. The lock now joins the streams' unnest, whose generic plan
	// guesses the array's length; a custom plan sees the streams as a
	// constant (a hash join over a sequential scan, or an index probe per
	// stream), their number and the table's current size, for about 0.3 ms
	// of planning. Only this statement changes mode: the previous mode is put
	// back right after it (SET LOCAL semantics: it never outlives the
	// transaction).
	qCustomPlans = `
SELECT set_config('onceflow.seqguard_plan_cache_mode', current_setting('plan_cache_mode'), true),
       set_config('onceflow.seqguard_enable_bitmapscan', current_setting('enable_bitmapscan'), true),
       set_config('onceflow.seqguard_enable_seqscan', current_setting('enable_seqscan'), true),
       set_config('onceflow.seqguard_enable_sort', current_setting('enable_sort'), true),
       set_config('plan_cache_mode', 'force_custom_plan', true)`
	qRestorePlans = `
SELECT set_config('plan_cache_mode', current_setting('onceflow.seqguard_plan_cache_mode'), true),
       set_config('enable_bitmapscan', current_setting('onceflow.seqguard_enable_bitmapscan'), true),
       set_config('enable_seqscan', current_setting('onceflow.seqguard_enable_seqscan'), true),
       set_config('enable_sort', current_setting('onceflow.seqguard_enable_sort'), true)`

	// qWalkPlans runs between qLockState and qReadState (and qRestorePlans
	// puts the previous settings back after it). qReadState finds each
	// stream's newest seq_applied entry by walking the primary key
	// backwards from the stream's top: the first live entry ends the walk,
	// whatever an old snapshot keeps below it. The planner does not know
	// that: its statistics count live rows (one per stream), not the
	// deleted entries a held snapshot keeps, so it expects one row either
	// way and may prefer a bitmap scan of the stream's whole key range,
	// which reads every kept entry and its heap page (measured on the
	// producer's counters, migration 029: 550 buffers per look-up after 65k
	// moves under one snapshot, against 3 for the walk). With bitmap and
	// sequential scans off for this one statement, every table it reads is
	// reached by its key and the walk is the plan chosen.
	qWalkPlans = `
SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true)`

	// qGapPlans runs after qWalkPlans, before qLoadGaps: with sorts off
	// too, each stream's open gaps are read from seq_gaps_open_from, whose
	// order is the one asked for. Planned with statistics taken while no
	// gap was open, the look-up read the whole partial index seq_gaps_open
	// (every open gap of every consumer) for each stream and sorted what
	// it kept: 7 ms against 0.4 ms for 268 streams and 220 open gaps.
	qGapPlans = `SELECT set_config('enable_sort', 'off', true)`

	// The timer's lock: one stream, never waiting. A stream with an open gap
	// has started or has parked events, so it adopts nothing (NULLs).
	qLockStateSkipLocked = `
SELECT source FROM onceflow.seq_state
WHERE consumer = $1 AND source = $2 AND producer = $3 AND topic = $4
FOR UPDATE SKIP LOCKED`

	// The given-up ranges holding a seq at or below last_applied: the event
	// is late if there is one, a duplicate if not.
	qGivenUpAt = `
SELECT from_seq, to_seq, opened_at, deadline FROM onceflow.seq_gaps
WHERE consumer = $1 AND source = $2 AND producer = $4 AND topic = $5
  AND state = 'given_up' AND from_seq <= $3 AND to_seq >= $3
ORDER BY from_seq`

	qDBNow = `SELECT now()`

	qLoadParked = `
SELECT k.source, k.producer, k.topic, i.seq, i.event_at FROM onceflow.inbox i
JOIN unnest($2::text[], $3::text[], $4::text[]) AS k(source, producer, topic)
    ON i.source = k.source AND i.producer = k.producer AND (k.producer = '' OR i.topic = k.topic)
WHERE i.consumer = $1 AND i.status = 'parked'
ORDER BY k.source, k.producer, k.topic, i.seq`

	// qLoadGaps reads the streams' open gaps, each stream's by its key in
	// the partial index seq_gaps_open_from, in from_seq order (scanGaps
	// appends). Run after qWalkPlans and qGapPlans:
	// joined to the streams as a table, its generic plan, with statistics
	// taken while seq_gaps was nearly empty, was a nested loop testing
	// every open gap of the consumer against every stream of the batch
	// (104,632 pairs for 156 gaps: 12–42 ms a batch in the swapped-pairs
	// drain), and a custom one still reads every open gap of the
	// consumer. See qGapPlans.
	qLoadGaps = `
SELECT g.source, g.producer, g.topic, g.from_seq, g.to_seq, g.opened_at, g.deadline, coalesce(g.give_up_requested_by, '')
FROM unnest($2::text[], $3::text[], $4::text[]) AS k(source, producer, topic)
CROSS JOIN LATERAL (
    SELECT * FROM onceflow.seq_gaps g
    WHERE g.consumer = $1 AND g.source = k.source AND g.producer = k.producer AND g.topic = k.topic AND g.state = 'open'
    ORDER BY g.from_seq -- and so not pulled up into a join: a look-up per stream
) AS g`

	// seq_state's last_applied (the floor) and first_seq are written when a
	// stream starts (or adopts its legacy state), and first_seq once ($5
	// NULL: unknown). Later moves go to seq_applied (qAppendApplied).
	qSaveState = `
UPDATE onceflow.seq_state SET last_applied = $3, updated_at = $4, first_seq = coalesce(first_seq, $5)
WHERE consumer = $1 AND source = $2 AND producer = $6 AND topic = $7`

	// Locked.Flush: the same for several streams at once.
	qSaveStates = `
UPDATE onceflow.seq_state s SET last_applied = u.last_applied, updated_at = $7,
    first_seq = coalesce(s.first_seq, nullif(u.first_seq, 0))
FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) AS u(source, producer, topic, last_applied, first_seq)
WHERE s.consumer = $1 AND s.source = u.source AND s.producer = u.producer AND s.topic = u.topic`

	// A stream's last_applied moves from $6 to $5: the new value is
	// inserted and the previous one deleted by its exact key (it may be
	// absent: the previous value was seq_state's floor). Both find their
	// entry by key, never by scanning a range an old snapshot fills with
	// versions vacuum may not remove yet.
	qAppendApplied = `
WITH gone AS (
    DELETE FROM onceflow.seq_applied
    WHERE consumer = $1 AND source = $2 AND producer = $3 AND topic = $4 AND last_applied = $6 AND $6 <> $5)
INSERT INTO onceflow.seq_applied (consumer, source, producer, topic, last_applied)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING`

	// Locked.Flush: the same for several streams at once. The previous
	// entries are found one stream at a time by their whole key (the LIMIT
	// keeps each look-up a nested loop step the planner cannot turn into a
	// join) and deleted by row address. A join of the batch's streams to
	// seq_applied was planned, with the table's statistics stale during a
	// drain, as a hash join over every entry of the consumer, live or not
	// yet vacuumed: 8,139 index entries read to delete 234 rows, 7.5 ms of
	// a batch's 40 at 1000 sources (session 14). The streams' seq_state rows
	// are locked by this transaction, so no one else moves these entries.
	qAppendApplieds = `
WITH u AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[]) AS u(source, producer, topic, last_applied, prev)),
gone AS (
    DELETE FROM onceflow.seq_applied a
    WHERE a.ctid = ANY (ARRAY(
        SELECT x.ctid FROM u
        CROSS JOIN LATERAL (
            SELECT x.ctid FROM onceflow.seq_applied x
            WHERE x.consumer = $1 AND x.source = u.source AND x.producer = u.producer AND x.topic = u.topic
              AND x.last_applied = u.prev
            LIMIT 1) x
        WHERE u.prev <> u.last_applied)))
INSERT INTO onceflow.seq_applied (consumer, source, producer, topic, last_applied)
SELECT $1, source, producer, topic, last_applied FROM u ORDER BY source, producer, topic
ON CONFLICT DO NOTHING`

	// The received event's inbox row (inserted by the consumer) becomes
	// parked or held, keeping what is needed to apply it later. NULL headers
	// or payload leave the row's own (the caller may have written them).
	qPark = `
UPDATE onceflow.inbox
SET status = $3, late = $4, headers = coalesce($5, headers), payload = coalesce($6, payload), processed_at = NULL
WHERE consumer = $1 AND event_id = $2`

	qMarkLate = `
UPDATE onceflow.inbox SET late = true WHERE consumer = $1 AND event_id = $2`

	// The stream's producer and topic are the last two parameters of each
	// gap statement.
	qGapOpen = `
INSERT INTO onceflow.seq_gaps (consumer, source, from_seq, to_seq, opened_at, deadline, producer, topic,
    give_up_requested_by, give_up_requested_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nullif($9, ''), CASE WHEN $9 <> '' THEN $6::timestamptz END)`

	qGapNarrow = `
UPDATE onceflow.seq_gaps SET from_seq = $5, to_seq = $6
WHERE consumer = $1 AND source = $2 AND producer = $7 AND topic = $8 AND state = 'open' AND from_seq = $3 AND to_seq = $4`

	qGapFill = `
UPDATE onceflow.seq_gaps SET state = 'filled', closed_at = $5
WHERE consumer = $1 AND source = $2 AND producer = $6 AND topic = $7 AND state = 'open' AND from_seq = $3 AND to_seq = $4`

	qGapGiveUp = `
UPDATE onceflow.seq_gaps SET state = 'given_up', give_up_reason = $5, closed_at = $6
WHERE consumer = $1 AND source = $2 AND producer = $7 AND topic = $8 AND state = 'open' AND from_seq = $3 AND to_seq = $4`

	// Streams with an expired open gap: candidates for the timer, read
	// without locks; each is then locked (SKIP LOCKED) and re-read.
	qExpiredStreams = `
SELECT DISTINCT source, producer, topic FROM onceflow.seq_gaps
WHERE consumer = $1 AND state = 'open' AND deadline <= $2
ORDER BY source, producer, topic
LIMIT $3`

	qStats = `
SELECT
    (SELECT count(*) FROM onceflow.seq_gaps WHERE consumer = $1 AND state = 'open'),
    (SELECT min(opened_at) FROM onceflow.seq_gaps WHERE consumer = $1 AND state = 'open'),
    now(),
    (SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND status = 'parked'),
    (SELECT count(*) FROM onceflow.inbox WHERE consumer = $1 AND status = 'held')`

	qListGaps = `
SELECT id, source, producer, topic, from_seq, to_seq, opened_at, deadline, state,
       coalesce(give_up_reason, ''), closed_at, resolved_at, coalesce(resolved_note, ''),
       coalesce(give_up_requested_by, '')
FROM onceflow.seq_gaps
WHERE consumer = $1 AND (
    state = 'open'
    OR ($2 AND state = 'given_up' AND (resolved_at IS NULL OR closed_at >= $3)))
ORDER BY state = 'open' DESC, source, producer, topic, from_seq, id`

	qResolveGaps = `
UPDATE onceflow.seq_gaps SET resolved_at = $6, resolved_note = $5
WHERE consumer = $1 AND source = $2 AND producer = $7 AND topic = $8 AND state = 'given_up' AND resolved_at IS NULL
  AND from_seq >= $3 AND to_seq <= $4`

	// An operator's give-up: under the stream's seq_state lock (the one the
	// consumer takes before it decides), every open gap of the stream from
	// the bottom up to the one holding $4 gets its deadline moved to now ($8,
	// or the database's clock when NULL; never later) and the requester. Gaps are given up in seq order, so
	// the gaps below the range go too; their deadlines stay in seq order.
	// Nothing is updated unless an open gap meets $3–$4.
	qLockStreamState = `
SELECT 1 FROM onceflow.seq_state
WHERE consumer = $1 AND source = $2 AND producer = $3 AND topic = $4
FOR UPDATE`
	qRequestGiveUp = `
UPDATE onceflow.seq_gaps g
SET deadline = least(g.deadline, coalesce($8, now())), give_up_requested_by = $5, give_up_requested_at = coalesce($8, now())
WHERE g.consumer = $1 AND g.source = $2 AND g.producer = $6 AND g.topic = $7 AND g.state = 'open'
  AND g.from_seq <= $4
  AND EXISTS (SELECT 1 FROM onceflow.seq_gaps m
              WHERE m.consumer = $1 AND m.source = $2 AND m.producer = $6 AND m.topic = $7 AND m.state = 'open'
                AND m.from_seq <= $4 AND m.to_seq >= $3)
RETURNING g.from_seq, g.to_seq`
)

// qLanesBeyond tells whether consumer $1 has a lane recorded in
// onceflow.inbox_lanes that $2 lacks (the inbox always passes legacy and
// permanent besides the recorded ones).
const qLanesBeyond = `SELECT EXISTS (SELECT 1 FROM onceflow.inbox_lanes WHERE consumer = $1 AND lane <> ALL($2::text[]))`

// loadParkedIn is qLoadParked for a consumer whose rows all lie in lanes:
// one arm per lane, each naming the lane and the consumer as constants
// (the first two columns of the inbox's partition key), so that the
// planner prunes every partition but the consumer's own of those lanes
// (and the default partition) when it plans the statement, generic plan
// or not. The consumer and the lanes are written as escaped string
// constants. qLoadParked itself when lanes is empty.
func loadParkedIn(consumer string, lanes []string) string {
	lanes = slices.Compact(slices.Sorted(slices.Values(lanes)))
	if len(lanes) == 0 {
		return qLoadParked
	}
	arms := make([]string, len(lanes))
	for i, lane := range lanes {
		arms[i] = fmt.Sprintf(`SELECT source, producer, topic, seq, event_at FROM onceflow.inbox
        WHERE lane = %s AND consumer = %s AND consumer = $1 AND status = 'parked'`, quoteLiteral(lane), quoteLiteral(consumer))
	}
	return `
SELECT k.source, k.producer, k.topic, i.seq, i.event_at FROM (
    ` + strings.Join(arms, "\n    UNION ALL\n    ") + `
) AS i
JOIN unnest($2::text[], $3::text[], $4::text[]) AS k(source, producer, topic)
    ON i.source = k.source AND i.producer = k.producer AND (k.producer = '' OR i.topic = k.topic)
ORDER BY k.source, k.producer, k.topic, i.seq`
}

// Un-park: the rows become processed and drop their payload; the old
// values are returned for the handler. qUnpark looks in every partition of
// onceflow.inbox; unparkIn in the consumer's lanes only. Bounded, the
// statement also takes the least and the greatest event_at of the rows
// ($7, $8: Locked.parkedAt), by which PostgreSQL prunes the lanes' other
// time buckets when the statement starts, before their scans are set up
// (a read and an update of each bucket of each lane, every un-park, cost
// a sixth of the swapped-pairs drain's time). Only unparkIn's statements
// are pruned so: the lane leads the partition key, and qUnparkAt names
// none.
var (
	qUnpark   = unparkSQL([]string{"consumer = $1"}, false)
	qUnparkAt = unparkSQL([]string{"consumer = $1"}, true)
)

// unparkIn is qUnpark (qUnparkAt when bounded) for the inbox partitions of
// consumer's lanes: one read and one update per lane, each naming the lane
// and the consumer as constants (pruned whatever the plan), their rows
// together. The lanes must be those the parked rows were read from
// (Locked.lanes). No lanes: qUnpark or qUnparkAt.
func unparkIn(consumer string, lanes []string, bounded bool) string {
	lanes = slices.Compact(slices.Sorted(slices.Values(lanes)))
	if len(lanes) == 0 {
		if bounded {
			return qUnparkAt
		}
		return qUnpark
	}
	at := make([]string, len(lanes))
	for n, lane := range lanes {
		at[n] = "lane = " + quoteLiteral(lane) + " AND consumer = " + quoteLiteral(consumer) + " AND consumer = $1"
	}
	return unparkSQL(at, bounded)
}

// unparkSQL un-parks the stream's rows at each of at (the partitions' part
// of a WHERE clause). Each pair's update finds its rows as its read does
// (the partial index inbox_parked, by source and seq), and the old values
// come from the read, of the statement's snapshot. The read takes no row
// lock: the update takes them (a row locked FOR UPDATE after the same
// statement's update changed it would be skipped), and the stream's lock
// keeps the rows as read (a row changed meanwhile is neither updated nor
// returned, and the guard fails the batch: "parked seq N has no inbox
// row"). An update joined to the read rows by event id was planned, with
// the statistics of a bucket analyzed while it was nearly empty, as a hash
// join over every row of the lane: 1.7 ms to un-park one row of 468 in
// bench-smoke's swapped drain, 0.3 ms this way.
func unparkSQL(at []string, bounded bool) string {
	stream := "source = $2 AND status = 'parked' AND seq = ANY($3::bigint[]) AND producer = $5 AND ($5 = '' OR topic = $6)"
	if bounded {
		// A parameter plus an interval is no constant to the planner, so a
		// custom plan cannot prune by it and costs what the generic one
		// does: PostgreSQL settles on the generic plan, which the executor
		// prunes when the statement starts. As plain parameters, every
		// custom plan pruned to one bucket, looked far cheaper than the
		// generic one, and the statement was planned on every execution
		// (TestUnparkSettlesOnAGenericPlan).
		stream = "event_at >= $7::timestamptz + interval '0 s' AND event_at <= $8::timestamptz + interval '0 s' AND " + stream
	}
	ctes := make([]string, 0, 2*len(at))
	arms := make([]string, len(at))
	for n, where := range at {
		ctes = append(ctes, fmt.Sprintf(`old%d AS (
    SELECT event_id, seq, event_type, topic, kafka_partition, kafka_offset, headers, payload
    FROM onceflow.inbox
    WHERE %s AND %s
)`, n, where, stream), fmt.Sprintf(`new%d AS (
    UPDATE onceflow.inbox
    SET status = 'processed', processed_at = $4, headers = NULL, payload = NULL
    WHERE %s AND %s
    RETURNING event_id
)`, n, where, stream))
		arms[n] = fmt.Sprintf("SELECT * FROM old%d WHERE event_id IN (SELECT event_id FROM new%d)", n, n)
	}
	return "\nWITH " + strings.Join(ctes, ",\n") + "\n" + strings.Join(arms, "\nUNION ALL\n")
}

// inLane bounds q, an update of one inbox row of consumer by event id
// ending in "WHERE consumer = $1 AND event_id = $2", to the row's lane:
// the lane and the consumer as constants, which the planner prunes the
// partitions by whatever the plan (an IN list or an OR of lanes is not
// pruned: every partition then), and to the time bucket of a row inserted
// by this transaction (event_at = now(), the insert's default): a generic
// plan prunes the lane's other buckets when the statement starts, before
// their scans are set up (9 index scans a statement for a 720h lane). An
// empty lane leaves q as it is.
func inLane(q, consumer, lane string) string {
	if lane == "" {
		return q
	}
	const where = "WHERE consumer = $1 AND event_id = $2"
	if !strings.HasSuffix(q, where) {
		panic("seqguard: inLane of a statement that does not end in " + where)
	}
	return strings.TrimSuffix(q, where) + "WHERE lane = " + quoteLiteral(lane) + " AND consumer = " + quoteLiteral(consumer) + " AND event_at = now() AND " + where[len("WHERE "):]
}

// quoteLiteral writes s as a PostgreSQL string constant in the escape form
// (E'...'), which means the same whatever standard_conforming_strings is.
func quoteLiteral(s string) string {
	return "E'" + literalEscapes.Replace(s) + "'"
}

// literalEscapes doubles backslashes and quotes (built once: building a
// Replacer cost more than the statements it was for).
var literalEscapes = strings.NewReplacer(`\`, `\\`, `'`, `''`)
