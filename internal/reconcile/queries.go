package reconcile

// The statements of a run. Every read runs in a READ ONLY, REPEATABLE READ
// transaction; the only write is the run's summary (qRecordRun), in a
// transaction of its own.

// The producing database.
const (
	qIdentity = `SELECT id::text, now() FROM onceflow.database_identity`

	// The outbox rows of a time window: each stream's seqs in order, and
	// whether the row still waits in the relay's queue. Created after
	// `until` (the settle time) is outside the window.
	qOutboxByTime = `
SELECT o.topic, o.source, o.seq, p.id IS NOT NULL
  FROM onceflow.outbox o
  LEFT JOIN onceflow.outbox_pending p ON p.id = o.id
 WHERE o.topic = ANY($1) AND o.created_at >= $2 AND o.created_at < $3
 ORDER BY o.topic, o.source, o.seq`

	// The same for an id range (the primary key), also bounded by the
	// settle time ($4).
	qOutboxByID = `
SELECT o.topic, o.source, o.seq, p.id IS NOT NULL
  FROM onceflow.outbox o
  LEFT JOIN onceflow.outbox_pending p ON p.id = o.id
 WHERE o.topic = ANY($1) AND o.id BETWEEN $2 AND $3 AND o.created_at < $4
 ORDER BY o.topic, o.source, o.seq`

	// The earliest created_at of an id range: where its records can start
	// on the topic.
	qIDRangeStart = `SELECT min(created_at) FROM onceflow.outbox WHERE id BETWEEN $1 AND $2`

	// A stream's outbox rows in a seq range, whatever their time: the
	// rows of records that are on the topic in the window but were
	// committed outside it. published: the publish log names the id.
	qStreamRows = `
SELECT o.seq,
       EXISTS (SELECT 1 FROM onceflow.outbox_published l
                WHERE int8range(l.first_id, l.last_id, '[]') @> o.id AND o.id = ANY (l.ids))
  FROM onceflow.outbox o
 WHERE o.topic = $1 AND o.source = $2 AND o.seq BETWEEN $3 AND $4
 ORDER BY o.seq`

	// Rows an operator skipped (relay outbox failed skip) in a seq range.
	qSkipped = `
SELECT count(*) FROM onceflow.outbox_set_aside
 WHERE topic = $1 AND source = $2 AND seq BETWEEN $3 AND $4 AND resolution = 'skipped'`
)

// The consumer's database.
const (
	// The consumer's stored next offsets.
	qOffsets = `
SELECT topic, kafka_partition, next_offset FROM onceflow.consumer_offsets
 WHERE group_id = $1 AND topic = ANY($2)`

	// The inbox rows of the window, each stream's seqs in order.
	qInbox = `
SELECT producer, topic, source, seq, status FROM onceflow.inbox
 WHERE consumer = $1 AND topic = ANY($2) AND received_at >= $3 AND seq IS NOT NULL
 ORDER BY producer, topic, source, seq`

	// Gaps given up in the window (legacy streams have topic '').
	qGivenUp = `
SELECT producer, topic, source, from_seq, to_seq, coalesce(give_up_reason, ''), closed_at,
       resolved_at IS NOT NULL, coalesce(resolved_note, '')
  FROM onceflow.seq_gaps
 WHERE consumer = $1 AND state = 'given_up' AND closed_at >= $2 AND (topic = ANY($3) OR topic = '')
 ORDER BY producer, topic, source, from_seq`

	qRecordRun = `
INSERT INTO onceflow.reconcile_runs (consumer, topics, started_at, finished_at, status, anomalies, report)
VALUES ($1, $2, $3, $4, $5, $6, $7)`

	qLastRun = `
SELECT id, consumer, topics, started_at, finished_at, status, anomalies, report
  FROM onceflow.reconcile_runs
 WHERE consumer = $1
 ORDER BY finished_at DESC, id DESC
 LIMIT 1`
)
