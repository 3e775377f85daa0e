package lease

// qLeaseLock serializes lease acquisitions (a transaction-level advisory
// lock under a key of its own, "ofrlease" in ASCII; migrate's is
// "onceflow"):
// a relay checks the other shard counts' leases and takes its own in one
// step, so that relays with two different counts cannot both lead.
const qLeaseLock = `SELECT pg_advisory_xact_lock(8027229195717407589)`

// qLeaseTryLock is qLeaseLock without waiting: a relay that finds the lock
// taken (another relay settling another shard count's leases, which takes
// seconds) stands by and tries again.
const qLeaseTryLock = `SELECT pg_try_advisory_xact_lock(8027229195717407589)`

// qOtherLayoutLeases lists the leases taken by relays of another layout
// than shard $2 of $1, and whether each is still live: another shard count,
// or, with one shard, another shard name (the one shard of a database has
// one lease, whatever a relay calls it: two names would be two leaders).
const qOtherLayoutLeases = `
SELECT shard, shards, holder, expires_at > now() FROM onceflow.relay_lease
 WHERE shards <> $1 OR ($1 = 1 AND shard <> $2) ORDER BY shard`

// qDropLayoutLease deletes an expired lease of another layout once its last
// checkpoint is settled.
const qDropLayoutLease = `DELETE FROM onceflow.relay_lease WHERE shard = $1 AND shards = $2 AND expires_at <= now()`

// qAcquireLease takes the shard's lease when it is free, expired, or held
// under our own holder id (a restarted process with a stable holder id, such
// as a Kubernetes pod name, does not wait for its own lease to expire). Every
// acquisition bumps the epoch. Times are the database's clock.
// The lease records the relay's shard count ($4).
const qAcquireLease = `
INSERT INTO onceflow.relay_lease AS l (shard, holder, epoch, acquired_at, renewed_at, expires_at, shards)
VALUES ($1, $2, 1, now(), now(), now() + make_interval(secs => $3), $4)
ON CONFLICT (shard) DO UPDATE
   SET holder = excluded.holder, epoch = l.epoch + 1, acquired_at = now(), renewed_at = now(),
       expires_at = excluded.expires_at, shards = excluded.shards
 WHERE l.expires_at <= now() OR l.holder = excluded.holder
RETURNING epoch`

// qRenewLease extends a lease that we still hold and that has not expired.
const qRenewLease = `
UPDATE onceflow.relay_lease
   SET renewed_at = now(), expires_at = now() + make_interval(secs => $4)
 WHERE shard = $1 AND holder = $2 AND epoch = $3 AND expires_at > now()`

// qReleaseLease lets a standby take over at once.
const qReleaseLease = `
UPDATE onceflow.relay_lease SET expires_at = now()
 WHERE shard = $1 AND holder = $2 AND epoch = $3`
