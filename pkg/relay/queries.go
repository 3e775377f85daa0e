package relay

// Every statement the package runs, in one place, named q<What>. Every
// table is schema-qualified.

// qSelectBatch reads the oldest unpublished rows: it walks the queue
// onceflow.outbox_pending in id order and looks each id up in the outbox.
// A row whose transaction commits late is still pending, so a later poll
// finds it (R1).
// The lookup is a LATERAL subquery the planner may not flatten (OFFSET 0):
// as a plain join PostgreSQL, expecting much of the queue to be read,
// prefers a merge join that walks the outbox's key from its first row,
// through every published row the retention keeps (25 ms instead of 3 for
// 1000 rows over 100k published ones).
// $2 are the ids of the previous batch, committed to Kafka and being marked
// concurrently (a hashed subplan, so the exclusion is cheap).
// Rows of a source with a set-aside row are held back until it is resolved
// or its retry time comes (R2, I3); retrying tells the relay to try such a
// row alone.
//
// $4 is the reader's scan floor (reader.go, floor): nothing at or below it
// is pending or can become pending, so the walk starts above it and does
// not visit the entries published since the oldest open snapshot.
//
// $3 is the batch's byte budget (Config.BatchMaxBytes), and the relay's
// memory is bounded by it whatever a row holds (I6). The size of each row
// (rowSize: payload, key, headers, names, read from the stored lengths
// without reading the values) comes first: a row over the budget is
// returned without its payload, key and headers, and with its names cut,
// so that the relay sets it aside unread; the batch ends before the row
// that would take it over budget (upto, the running sum of what is
// returned, in id order), so no more than the budget crosses the wire.
const qSelectBatch = qSelectBatchHead + `
 ORDER BY p.id
 LIMIT $1` + qSelectBatchTail

// qSelectBatchShard is qSelectBatch for shard $6 of $5 (Config.Shards > 1):
// it walks the pending ids in order and keeps the rows of its own sources.
//
// The shard test is wrapped in a CASE on purpose, here and in the other
// shard statements. PostgreSQL estimates an equality on an expression it
// has no statistics for at 0.5 % of the rows; expecting a few hundred rows
// in all, it sorts the whole backlog (a sequential scan computing every
// row's MD5, 280 ms for 200k rows) instead of walking outbox_unpublished in
// id order and stopping at the limit (2.5 ms). A boolean expression it
// cannot look into is estimated at 50 %, which is the truth for 2 shards
// and close enough for more.
const qSelectBatchShard = qSelectBatchHead + `
   AND CASE WHEN onceflow.source_shard(o.source, $5) = $6 THEN true ELSE false END
 ORDER BY p.id
 LIMIT $1` + qSelectBatchTail

// rowSize is what a row weighs against Config.BatchMaxBytes. octet_length
// reads a stored value's length from its header (compressed or not) and
// does not detoast it; only the headers (jsonb) are measured as the text
// the relay receives.
const rowSize = `(octet_length(o.payload)::bigint + coalesce(octet_length(o.record_key), 0)
                 + octet_length(o.headers::text) + octet_length(o.event_id) + octet_length(o.topic)
                 + octet_length(o.source) + octet_length(o.event_type) + octet_length(o.content_type) + 64)`

const qSelectBatchHead = `
SELECT id, event_id, topic, source, seq, event_type, content_type, record_key, headers, payload, retrying, size
  FROM (
SELECT o.id, o.seq, o.size,
       CASE WHEN o.size <= $3 THEN o.event_id ELSE left(o.event_id, 200) END AS event_id,
       CASE WHEN o.size <= $3 THEN o.topic ELSE left(o.topic, 250) END AS topic,
       CASE WHEN o.size <= $3 THEN o.source ELSE left(o.source, 200) END AS source,
       CASE WHEN o.size <= $3 THEN o.event_type ELSE left(o.event_type, 200) END AS event_type,
       CASE WHEN o.size <= $3 THEN o.content_type ELSE left(o.content_type, 200) END AS content_type,
       CASE WHEN o.size <= $3 THEN o.record_key END AS record_key,
       CASE WHEN o.size <= $3 THEN o.headers END AS headers,
       CASE WHEN o.size <= $3 THEN o.payload END AS payload,
       EXISTS (SELECT 1 FROM onceflow.outbox_set_aside a WHERE a.outbox_id = o.id AND a.resolved_at IS NULL) AS retrying,
       sum(CASE WHEN o.size <= $3 THEN o.size ELSE 1024 END) OVER (ORDER BY p.id ROWS UNBOUNDED PRECEDING)::bigint AS upto
  FROM onceflow.outbox_pending p
 CROSS JOIN LATERAL (SELECT o.*, ` + rowSize + ` AS size FROM onceflow.outbox o WHERE o.id = p.id OFFSET 0) o
 WHERE p.id > $4::bigint
   AND p.id NOT IN (SELECT unnest($2::bigint[]))
   AND o.source NOT IN (` + qHeldSources + `)`

// qSelectBatchTail keeps the rows within the byte budget $3: the first
// row always (it weighs at most $3 as returned), then up to the budget.
// It has no ORDER BY of its own: one would sort what the walk returns in
// order already (PostgreSQL does not see it), so fetch sorts the few rows
// it gets instead.
const qSelectBatchTail = `
) b
 WHERE b.upto <= $3 OR b.upto = CASE WHEN b.size <= $3 THEN b.size ELSE 1024 END`

// qSweep queues the outbox rows with ids in ($1, $2] that are neither
// queued nor in the publish log (reader.go). It returns how many it queued,
// their lowest and highest id, how many of them have a later row of their
// source that is neither queued nor among them (published already: they
// come out of order), and the newest outbox id. (The later-row test is a
// LATERAL … LIMIT 1, so that it probes the (source, seq) key once per row
// found instead of joining the whole outbox.)
//
// Its queue tests are NOT EXISTS subqueries with OFFSET 0, which PostgreSQL
// does not turn into a join: each is one probe of the queue's key per outbox
// row of the range, so a sweep costs what its range holds, however long the
// queue. As anti joins they were planned by the queue's statistics, which
// are stale whenever a large transaction commits between two ANALYZEs: a
// queue taken for a few rows and holding a million was hashed whole at every
// sweep (about 230 ms each), or, with sequential scans off, merged from its
// lowest key (3.6 s).
//
// Its read of the publish log names the bound last_id > $1 (every batch
// overlapping the range ends above its start), so that PostgreSQL skips
// the log's partitions below the range (migration 035) and reads the rest
// by their index on last_id.
const qSweep = qSweepHead + qSweepTail

// qSweepShard is qSweep for the sources of shard $4 of $3.
const qSweepShard = qSweepHead + `
       AND CASE WHEN onceflow.source_shard(o.source, $3) = $4 THEN true ELSE false END` + qSweepTail

const qSweepHead = `
WITH r AS (
    SELECT o.id, o.source, o.seq FROM onceflow.outbox o
     WHERE o.id > $1 AND o.id <= $2
       AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_pending p WHERE p.id = o.id OFFSET 0)`

const qSweepTail = `
), l AS (
    SELECT u.id FROM onceflow.outbox_published l CROSS JOIN LATERAL unnest(l.ids) AS u(id)
     WHERE l.last_id > $1::bigint AND int8range(l.first_id, l.last_id, '[]') && int8range($1::bigint, $2::bigint, '(]')
), f AS (
    INSERT INTO onceflow.outbox_pending (id)
    SELECT id FROM r WHERE id NOT IN (SELECT id FROM l)
    ON CONFLICT DO NOTHING
    RETURNING id
), fr AS MATERIALIZED (
    SELECT r.source, r.seq FROM f JOIN r USING (id)
)
SELECT (SELECT count(*) FROM f), coalesce((SELECT min(id) FROM f), 0), coalesce((SELECT max(id) FROM f), 0),
       (SELECT count(*) FROM fr
         CROSS JOIN LATERAL (SELECT 1 FROM onceflow.outbox o2
                              WHERE o2.source = fr.source AND o2.seq > fr.seq AND o2.id NOT IN (SELECT id FROM f)
                                AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_pending p WHERE p.id = o2.id OFFSET 0)
                              LIMIT 1) later),
       coalesce((SELECT max(id) FROM onceflow.outbox), 0)`

// qBeginWalk begins the reader's REPEATABLE READ transaction (the sweeps
// and the poll) with sequential and bitmap scans off, and qIndexPlans sets
// the same for the rest of a transaction (an idle poll sends it in one batch
// with the poll: the batch's statements run in one implicit transaction).
//
// The poll must walk the queue's key from the floor and stop at the batch's
// limit. The planner chooses that walk by the queue's statistics, and the
// queue's size swings faster than autovacuum analyzes it: analyzed while
// nearly empty, then given a million rows by one transaction, it is taken
// for a few rows, and each poll reads the whole queue, looks every entry up
// in the outbox and sorts them (2.0–2.8 s per poll, against a few ms). With
// these scans off the key's index is the only way in; the statements of the
// transaction have no other use for a sequential scan (every table they read
// is read by a key range or probed by id).
//
// JIT compilation is off for the same statements: the sweep's estimated cost
// (its out-of-order check is costed as if every found row had thousands of
// later rows) is far above jit_above_cost, so PostgreSQL compiled it (76
// functions) at every execution: 17–23 ms for a tail of 2,000 ids that runs
// in 3.5–4 ms without (session 13); it cost the relay's drain about a third
// of its rate.
const (
	qBeginWalk  = `BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off`
	qIndexPlans = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), set_config('jit', 'off', true)`
)

// qScanMark is the mark the scan floor rises by: the highest id drawn so
// far and an xid above that of every transaction that drew one
// (migration 024).
const qScanMark = `SELECT last_id, mark_xid::text::bigint FROM onceflow.outbox_scan_mark()`

// qScanOldest reads the oldest xid still running in this database.
//
// It is that of the sessions of this database that have one and of its
// prepared transactions, or the snapshot's xmax when there are none: only
// a transaction of this database can insert into its outbox, so a writer
// held open in another database of the same server (xids are server-wide,
// the snapshot's xmin would wait for it) no longer holds the floor.
// pg_stat_activity and pg_prepared_xacts give 32-bit xids: each is widened
// against the snapshot's xmax, below which every running xid lies. One
// that started after the snapshot widens to about 2^32 too low, which only
// makes the floor wait (never rise too early). The sessions are read
// before the prepared transactions (Append runs its branches in order): a
// transaction being prepared joins pg_prepared_xacts before it leaves its
// session, so it is seen in one or the other.
//
// The floor then rises to just below the lowest pending id (qScanLowest),
// read by a statement of its own, after this one: a statement reads the
// rows in the snapshot it took when it began, before it looks at the
// running transactions, so a writer that commits in between would be
// neither running nor visible, and the floor would pass its row (found
// only by the full walk, after later rows of its source).
const qScanOldest = `
WITH s AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax),
w AS (
    SELECT a.backend_xid::text::bigint AS xid FROM pg_stat_activity a
     WHERE a.datid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
       AND a.backend_xid IS NOT NULL
    UNION ALL
    SELECT p.transaction::text::bigint FROM pg_prepared_xacts p WHERE p.database = current_database()
)
SELECT coalesce((SELECT min(s.xmax - (((s.xmax % 4294967296) - w.xid + 4294967296) % 4294967296)) FROM w), s.xmax)
  FROM s`

// qScanLowest is the lowest pending id above $1 (0: none). The walk visits
// the entries deleted since the floor last rose, no more.
const qScanLowest = `
SELECT coalesce((SELECT p.id FROM onceflow.outbox_pending p WHERE p.id > $1 ORDER BY p.id LIMIT 1), 0)`

// qPendingBelow is the lowest pending id in ($1, $2] (0: none): the full
// walk's check that nothing pending hides below the floor.
const qPendingBelow = `
SELECT coalesce((SELECT p.id FROM onceflow.outbox_pending p WHERE p.id > $1 AND p.id <= $2 ORDER BY p.id LIMIT 1), 0)`

// qServerEncoding is the database's encoding.
const qServerEncoding = `SELECT current_setting('server_encoding')`

// qOutboxMaxID is the newest visible outbox id (0: none).
const qOutboxMaxID = `SELECT coalesce(max(id), 0) FROM onceflow.outbox`

// qHeldSources are the sources the relay publishes nothing of: their
// set-aside row waits for an operator or for its retry time.
const qHeldSources = `SELECT h.source FROM onceflow.outbox_set_aside h
                         WHERE h.resolved_at IS NULL AND (h.retry_at IS NULL OR h.retry_at > now())`

// qMarkPublished records a committed batch published: its ids leave the
// queue and the publish log gets one row for them (none when every id had
// left already: marking is idempotent). It resolves the set-aside entries of
// rows that were retried and returns how many rows it marked. The outbox
// rows themselves are not written.
const qMarkPublished = `
WITH m AS (
    DELETE FROM onceflow.outbox_pending WHERE id = ANY($1::bigint[])
    RETURNING id
), l AS (
    INSERT INTO onceflow.outbox_published (first_id, last_id, ids)
    SELECT min(id), max(id), array_agg(id ORDER BY id) FROM m HAVING count(*) > 0
), r AS (
    UPDATE onceflow.outbox_set_aside a SET resolved_at = now(), resolution = 'published'
      FROM m WHERE a.outbox_id = m.id AND a.resolved_at IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM r)`

// qDeletePublished is qMarkPublished for Config.DeleteOnPublish: it deletes
// the pending rows of the batch (the trigger outbox_pending_delete takes
// their ids off the queue) and logs nothing.
const qDeletePublished = `
WITH m AS (
    DELETE FROM onceflow.outbox o
     WHERE o.id = ANY($1::bigint[]) AND EXISTS (SELECT 1 FROM onceflow.outbox_pending p WHERE p.id = o.id)
    RETURNING o.id
), r AS (
    UPDATE onceflow.outbox_set_aside a SET resolved_at = now(), resolution = 'published'
      FROM m WHERE a.outbox_id = m.id AND a.resolved_at IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM r)`

// qPrune deletes the rows of the oldest batches published before the
// retention ($1 seconds), whole batches, about $2 rows in all (at least one
// batch), with their log rows. Batches another relay is pruning (shards) are
// skipped, not waited for. It returns the rows and the batches it deleted.
// The batch holding the highest id ever published is kept with its rows
// (each pruned batch's last_id is below one still in the log): recovery's
// restore check reads that id (qOutboxLastID).
//
// Only the rows of the legacy and the default partitions are pruned so
// (migration 034): a batch with an id in one of the id-range partitions
// goes with its partition (qExpirePartition). Likewise only the log rows
// of the publish log's legacy and default partitions are deleted: a batch
// in one of the log's range partitions goes with it (migration 035,
// qDropLogPartitions), even once its outbox range is dropped.
const qPrune = `
WITH l AS (
    SELECT batch, published_at, ids FROM onceflow.outbox_published
     WHERE published_at < now() - make_interval(secs => $1)
       AND last_id < (SELECT max(last_id) FROM onceflow.outbox_published)
       AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_partitions x
                        WHERE x.relname LIKE 'outbox\_p\_%' AND int8range(x.from_id, x.to_id) && int8range(first_id, last_id, '[]'))
       AND NOT EXISTS (SELECT 1 FROM onceflow.outbox_published_partitions g
                        WHERE g.dropped_at IS NULL AND g.relname LIKE 'outbox\_published\_p\_%'
                          AND last_id >= g.from_id AND last_id < g.to_id)
     ORDER BY published_at, batch
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), k AS (
    SELECT batch, ids FROM (SELECT batch, ids, sum(cardinality(ids)) OVER (ORDER BY published_at, batch) AS upto FROM l) s
     WHERE upto - cardinality(ids) < $2
), d AS (
    DELETE FROM onceflow.outbox o WHERE o.id IN (SELECT unnest(ids) FROM k)
    RETURNING 1
), b AS (
    DELETE FROM onceflow.outbox_published p WHERE p.batch IN (SELECT batch FROM k)
    RETURNING 1
)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM b)`

// Partitions of the outbox (migration 034; housekeeping.go, partitions).

// qEnsurePartitions makes the id-range partitions ahead of the id sequence.
const qEnsurePartitions = `SELECT onceflow.outbox_ensure_partitions()`

// qPartitionsDue lists the partitions whose every id has been drawn (by
// the sequence, or, on a logical-replication subscriber, by the publisher:
// the table's highest id) and that are not emptied yet, oldest first:
// retention's candidates.
const qPartitionsDue = `
SELECT p.from_id FROM onceflow.outbox_partitions p
 WHERE p.truncated_at IS NULL AND (p.relname = 'outbox_legacy' OR p.relname LIKE 'outbox\_p\_%')
   AND p.to_id - 1 <= greatest(coalesce(pg_sequence_last_value('onceflow.outbox_id_seq'::regclass), 0),
                               coalesce((SELECT max(o.id) FROM onceflow.outbox o), 0))
 ORDER BY p.from_id`

// qExpirePartition empties partition $1 when its rows may go (retention
// $2 seconds): the rows it removed, NULL when it may not go yet.
const qExpirePartition = `SELECT onceflow.outbox_expire_partition($1, make_interval(secs => $2))`

// qPartitionsTruncated lists the emptied partitions still attached.
const qPartitionsTruncated = `
SELECT p.from_id FROM onceflow.outbox_partitions p
 WHERE p.truncated_at IS NOT NULL AND (p.relname = 'outbox_legacy' OR p.relname LIKE 'outbox\_p\_%')
 ORDER BY p.from_id`

// qDropPartition drops the emptied partition $1.
const qDropPartition = `SELECT onceflow.outbox_drop_partition($1)`

// qDropLogPartitions drops the publish log's partitions whose batches may
// all go (retention $1 seconds): each outbox range below the partition's
// end truncated or dropped, its batches older than the retention, and not
// the one holding the highest last_id (migration 035). It returns each
// partition dropped (its first last_id) and the batches it held.
const qDropLogPartitions = `SELECT from_id, batches FROM onceflow.outbox_published_drop_partitions(make_interval(secs => $1))`

// qStats counts unpublished rows: all of them, those held behind a
// set-aside row, the age of the oldest one not held, and the open set-aside
// entries.
const qStats = `
WITH held AS (SELECT DISTINCT source FROM onceflow.outbox_set_aside WHERE resolved_at IS NULL),
     p AS (SELECT o.created_at, o.source IN (SELECT source FROM held) AS held
             FROM onceflow.outbox_pending q JOIN onceflow.outbox o ON o.id = q.id)
SELECT count(*),
       count(*) FILTER (WHERE held),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE NOT held)), 0)::float8,
       (SELECT count(*) FROM onceflow.outbox_set_aside WHERE resolved_at IS NULL)
  FROM p`

// qStatsSerial keeps qStats on its own backend (no parallel workers) and
// uncompiled (no JIT: a count of the queue is not worth compiling).
const qStatsSerial = `SET LOCAL max_parallel_workers_per_gather = 0; SET LOCAL jit = off`

// qStatsShard is qStats for the rows of shard $2 of $1.
const qStatsShard = `
WITH held AS (SELECT DISTINCT source FROM onceflow.outbox_set_aside
               WHERE resolved_at IS NULL AND onceflow.source_shard(source, $1) = $2),
     p AS (SELECT o.created_at, o.source IN (SELECT source FROM held) AS held
             FROM onceflow.outbox_pending q JOIN onceflow.outbox o ON o.id = q.id
            WHERE onceflow.source_shard(o.source, $1) = $2)
SELECT count(*),
       count(*) FILTER (WHERE held),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE NOT held)), 0)::float8,
       (SELECT count(*) FROM onceflow.outbox_set_aside
         WHERE resolved_at IS NULL AND onceflow.source_shard(source, $1) = $2)
  FROM p`

// qLeaderlessShards counts the shards 0…$1-1 of shard count $1 that have no
// live lease of that count.
const qLeaderlessShards = `
SELECT count(*) FROM generate_series(0, $1 - 1) AS k
 WHERE NOT EXISTS (SELECT 1 FROM onceflow.relay_lease l
                    WHERE l.shard = k::text AND l.shards = $1 AND l.expires_at > now())`

// notifyChannel is what the trigger onceflow.outbox_notify notifies.
const notifyChannel = "onceflow_outbox"

// qOutboxLastID is the highest id the outbox has held: what its sequence
// has handed out, or the highest id in the table when that is higher (NULL
// before the first row). A checkpoint naming a higher id comes from a
// database that has since been restored to an earlier point. The table's
// highest id counts because logical replication writes rows with the ids
// they had at the source and does not carry sequences: on a subscriber the
// sequence stays where it was (unused), while the relay publishes the
// replicated rows. In a restored database every row's id came from the
// sequence, so the table adds nothing there. The publish log's highest
// last_id counts for the same reason once the replicated rows are pruned:
// qPrune never removes the batch that holds it (migration 031).
const qOutboxLastID = `SELECT greatest(pg_sequence_last_value(pg_get_serial_sequence('onceflow.outbox', 'id')::regclass),
       (SELECT max(id) FROM onceflow.outbox),
       (SELECT max(last_id) FROM onceflow.outbox_published))`

// qCheckpointRows reads what recovery checks a checkpoint against.
const qCheckpointRows = `
SELECT o.id, o.event_id, o.source, EXISTS (SELECT 1 FROM onceflow.outbox_pending p WHERE p.id = o.id)
  FROM onceflow.outbox o WHERE o.id = ANY($1::bigint[])`

// qCheckpointStreams reads, for each stream a checkpoint names ($1 topics,
// $2 sources, $3 seqs; ord is the position, from 1), the row holding that
// seq (NULL: pruned, deleted, or never written here) and the stream's
// counter (NULL: none): its (source, topic) counter (the greater of the
// locked row and its newest move, migration 029), or, for a stream that
// has not written since migration 015, its source's counter from before
// (source_seq_legacy, from which its counter would start). It is the one
// statement that knows how streams are keyed.
const qCheckpointStreams = `
SELECT h.ord, o.id, o.event_id, coalesce(greatest(c.last_seq, m.last_seq), l.last_seq)
  FROM unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY AS h(topic, source, seq, ord)
  LEFT JOIN onceflow.outbox o ON o.source = h.source AND o.topic = h.topic AND o.seq = h.seq
  LEFT JOIN onceflow.source_seq c ON c.source = h.source AND c.topic = h.topic
  LEFT JOIN LATERAL (SELECT m.last_seq FROM onceflow.source_seq_moves m WHERE m.source = h.source AND m.topic = h.topic
                      ORDER BY m.last_seq DESC LIMIT 1) m ON true
  LEFT JOIN onceflow.source_seq_legacy l ON l.source = h.source`

// Set-aside rows (setaside.go, the publisher).

// qSetAside opens (or, for a row retried and refused again, updates) the
// set-aside entry of an unpublished row. $4 > 0 schedules an automatic
// retry after $4 seconds, doubling per attempt up to $5 seconds.
const qSetAside = `
INSERT INTO onceflow.outbox_set_aside AS a (outbox_id, event_id, topic, source, seq, event_type, reason, error, retry_at)
SELECT o.id, o.event_id, o.topic, o.source, o.seq, o.event_type, $2, $3,
       CASE WHEN $4::float8 > 0 THEN now() + make_interval(secs => $4::float8) END
  FROM onceflow.outbox o
 WHERE o.id = $1 AND EXISTS (SELECT 1 FROM onceflow.outbox_pending p WHERE p.id = o.id)
ON CONFLICT (outbox_id) DO UPDATE
   SET reason = excluded.reason, error = excluded.error, attempts = a.attempts + 1, last_failed_at = now(),
       retry_at = CASE WHEN $4::float8 > 0
                       THEN now() + make_interval(secs => least($4::float8 * power(2, a.attempts), $5::float8)) END
 WHERE a.resolved_at IS NULL
RETURNING (xmax = 0), attempts`

// qSetAsideClaim is the relay's claim on a set-aside row it is about to
// publish again: it returns the row only while its entry is open and its
// retry due. Its lock waits for a skip that holds the entry (qSetAsideSkipLock)
// and then sees the skip's outcome; a skip that locks the entry after the
// claim finds the retry due and refuses. So a row is never both skipped and
// published.
const qSetAsideClaim = `
SELECT outbox_id FROM onceflow.outbox_set_aside
 WHERE outbox_id = $1 AND resolved_at IS NULL AND retry_at <= now() FOR UPDATE`
