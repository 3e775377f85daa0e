package identity

// Statements of identity.go.

// QCols are the columns Scan reads.
const QCols = `id::text, created_at, cluster_system_id, database_oid, first_used_at, changed_at, changed_by, change_note`

// QSelect reads the identity.
const QSelect = `SELECT ` + QCols + ` FROM onceflow.database_identity`

const qIdentityUsed = `UPDATE onceflow.database_identity SET first_used_at = now() WHERE first_used_at IS NULL`

const qIdentityRemint = `
UPDATE onceflow.database_identity
   SET id = gen_random_uuid(), cluster_system_id = $1, database_oid = $2, first_used_at = now(),
       changed_at = now(), changed_by = current_user,
       change_note = 'new identity: a copy of a database whose relay never ran'
RETURNING ` + QCols

const qPlaceOID = `SELECT oid FROM pg_database WHERE datname = current_database()`

const qPlaceCluster = `SELECT system_identifier::text FROM pg_control_system()`
