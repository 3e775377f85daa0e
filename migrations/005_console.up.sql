-- Operator console (internal/admin, docs/console.md).
--
-- Every change an operator makes through the admin API or the operator
-- commands (`consumer dlq replay`, `consumer gaps resolve`) is one row here:
-- who, when, what, why. request_id makes a change idempotent: a second
-- request with the same id is not carried out again; it gets the first one's
-- result back. A request's row is inserted, and its result written, in one
-- transaction that stays open while the change runs, so a second request
-- with the same id waits for the first and then reads its result.
CREATE TABLE onceflow.admin_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id  text        NOT NULL,
    -- The logical consumer (inbox ledger) the change was made to.
    consumer    text        NOT NULL,
    -- dlq.replay | gap.resolve
    action      text        NOT NULL,
    -- Who: the X-Onceflow-Actor header, else the token's name (API); the
    -- -actor flag, else the OS user (commands).
    actor       text        NOT NULL,
    -- How: api:<token name> or cli.
    via         text        NOT NULL,
    -- The request as given (filter, event id, range, note …), compared when
    -- a request id comes back.
    params      jsonb       NOT NULL,
    note        text        NOT NULL DEFAULT '',
    -- ok | partial (some events failed or were skipped) | rejected (nothing
    -- to do: not found) | error (stopped part-way)
    outcome     text        NOT NULL,
    -- What the first request was answered.
    result      jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    CONSTRAINT admin_audit_request_id UNIQUE (request_id),
    CONSTRAINT admin_audit_request_id_len CHECK (length(request_id) BETWEEN 1 AND 200),
    CONSTRAINT admin_audit_action CHECK (action IN ('dlq.replay', 'gap.resolve')),
    CONSTRAINT admin_audit_outcome CHECK (outcome IN ('running', 'ok', 'partial', 'rejected', 'error'))
);
CREATE INDEX admin_audit_created_at ON onceflow.admin_audit (created_at);

-- The relay's status for anyone allowed to execute this function: the
-- leases, how many outbox rows wait and since when. It runs with its
-- owner's rights (SECURITY DEFINER), so the consumer's role can show relay
-- status without being able to read outbox payloads.
CREATE FUNCTION onceflow.relay_status()
RETURNS TABLE (pending_rows bigint, oldest_unpublished_at timestamptz, db_now timestamptz, leases jsonb)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT (SELECT count(*) FROM onceflow.outbox WHERE published_at IS NULL),
           (SELECT min(created_at) FROM onceflow.outbox WHERE published_at IS NULL),
           now(),
           coalesce((SELECT jsonb_agg(jsonb_build_object(
                        'shard', l.shard, 'holder', l.holder, 'epoch', l.epoch,
                        'acquired_at', l.acquired_at, 'renewed_at', l.renewed_at,
                        'expires_at', l.expires_at, 'live', l.expires_at > now())
                        ORDER BY l.shard)
                     FROM onceflow.relay_lease l), '[]'::jsonb)
$fn$;
REVOKE ALL ON FUNCTION onceflow.relay_status() FROM PUBLIC;
