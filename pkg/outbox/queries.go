package outbox

// All SQL of the package. Every table is schema-qualified.

// enqueueSQL allocates the next seq of the source by upserting its counter row
// and inserts the outbox row in the same statement: the counter row stays
// locked until the producer's transaction ends, so producers of one source
// serialize, seqs are gap-free (a rollback burns nothing) and, per source, id
// order is seq order.
const enqueueSQL = `
WITH s AS (
    INSERT INTO onceflow.source_seq AS c (source, last_seq) VALUES ($3, 1)
    ON CONFLICT (source) DO UPDATE SET last_seq = c.last_seq + 1
    RETURNING c.last_seq
)
INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload)
SELECT coalesce($1, gen_random_uuid()::text), $2, $3, s.last_seq, $4, $5, $6, $7, $8 FROM s
RETURNING event_id, seq`

// enqueueBatchSQL is enqueueSQL for a whole batch in one statement. Per
// source, the counter row is upserted once, bumped by the source's number of
// messages, in source order (the lock order, so that batches cannot deadlock
// each other); the rows then take last_seq - count + 1 … last_seq in their
// order in the batch, and are inserted sorted by source, then position, so
// that per source id order is seq order. It returns each source's new
// last_seq, from which the caller knows every message's seq.
// $1 event ids, $2 topics, $3 sources, $4 event types, $5 content types,
// $6 record keys (NULL: the source), $7 headers (JSON text), $8 payloads.
const enqueueBatchSQL = `
WITH m AS (
    SELECT m.*, row_number() OVER (PARTITION BY m.source ORDER BY m.ord) AS k
      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bytea[], $7::text[], $8::bytea[])
           WITH ORDINALITY AS m(event_id, topic, source, event_type, content_type, record_key, headers, payload, ord)
), n AS (
    SELECT source, count(*) AS n FROM m GROUP BY source
), c AS (
    INSERT INTO onceflow.source_seq AS c (source, last_seq)
    SELECT source, n FROM n ORDER BY source
    ON CONFLICT (source) DO UPDATE SET last_seq = c.last_seq + excluded.last_seq
    RETURNING c.source, c.last_seq
), ins AS (
    INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, record_key, headers, payload)
    SELECT m.event_id, m.topic, m.source, c.last_seq - n.n + m.k,
           m.event_type, m.content_type, m.record_key, m.headers::jsonb, m.payload
      FROM m JOIN n USING (source) JOIN c USING (source)
     ORDER BY m.source, m.k
)
SELECT source, last_seq FROM c`

// selectBatchSQL reads the oldest unpublished rows through the partial index
// outbox_unpublished. A row whose transaction commits late is still
// unpublished, so a later poll finds it (R1).
// $2 are the ids of the previous batch, committed to Kafka and being marked
// concurrently (a hashed subplan, so the exclusion is cheap).
const selectBatchSQL = `
SELECT id, event_id, topic, source, seq, event_type, content_type, record_key, headers, payload
  FROM onceflow.outbox
 WHERE published_at IS NULL
   AND id NOT IN (SELECT unnest($2::bigint[]))
 ORDER BY id
 LIMIT $1`

const markPublishedSQL = `
UPDATE onceflow.outbox SET published_at = now()
 WHERE id = ANY($1::bigint[]) AND published_at IS NULL`

// deletePublishedSQL is markPublishedSQL for Config.DeleteOnPublish.
const deletePublishedSQL = `
DELETE FROM onceflow.outbox WHERE id = ANY($1::bigint[]) AND published_at IS NULL`

// pruneSQL deletes one small batch of rows published before the retention.
const pruneSQL = `
DELETE FROM onceflow.outbox
 WHERE id IN (SELECT id FROM onceflow.outbox
               WHERE published_at IS NOT NULL AND published_at < now() - make_interval(secs => $1)
               ORDER BY published_at
               LIMIT $2)`

const statsSQL = `
SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
  FROM onceflow.outbox
 WHERE published_at IS NULL`

// acquireLeaseSQL takes the shard's lease when it is free, expired, or held
// under our own holder id (a restarted process with a stable holder id, such
// as a Kubernetes pod name, does not wait for its own lease to expire). Every
// acquisition bumps the epoch. Times are the database's clock.
const acquireLeaseSQL = `
INSERT INTO onceflow.relay_lease AS l (shard, holder, epoch, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, 1, now(), now(), now() + make_interval(secs => $3))
ON CONFLICT (shard) DO UPDATE
   SET holder = excluded.holder, epoch = l.epoch + 1, acquired_at = now(), renewed_at = now(),
       expires_at = excluded.expires_at
 WHERE l.expires_at <= now() OR l.holder = excluded.holder
RETURNING epoch`

// renewLeaseSQL extends a lease that we still hold and that has not expired.
const renewLeaseSQL = `
UPDATE onceflow.relay_lease
   SET renewed_at = now(), expires_at = now() + make_interval(secs => $4)
 WHERE shard = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()`

// releaseLeaseSQL lets a standby take over at once.
const releaseLeaseSQL = `
UPDATE onceflow.relay_lease SET expires_at = now()
 WHERE shard = $1 AND holder = $2 AND epoch = $3`

// notifyChannel is what the trigger onceflow.outbox_notify notifies.
const notifyChannel = "onceflow_outbox"
