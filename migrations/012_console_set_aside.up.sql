-- The relay's set-aside rows on the operator console (docs/console.md),
-- and the retention of the console's audit and of resolved set-aside rows.
--
-- The rows Kafka refused permanently and the relay set aside
-- (onceflow.outbox_set_aside, migration 008) that are still open: what the
-- console's relay panel lists. Like onceflow.relay_status(), it runs with its
-- owner's rights (SECURITY DEFINER) so that the consumer's role, which cannot
-- read onceflow.outbox_set_aside, can show them: identity, reason and error
-- only, never the payload nor a skipped row's copy. total is the number of
-- open rows (the same on every row; no row when there are none), of which at
-- most max_rows are returned, oldest first.
CREATE FUNCTION onceflow.relay_set_aside(max_rows integer DEFAULT 100)
RETURNS TABLE (outbox_id bigint, event_id text, topic text, source text, seq bigint, event_type text,
               reason text, error text, attempts integer, set_aside_at timestamptz,
               last_failed_at timestamptz, retry_at timestamptz, total bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT s.outbox_id, s.event_id, s.topic, s.source, s.seq, s.event_type,
           s.reason, s.error, s.attempts, s.set_aside_at,
           s.last_failed_at, s.retry_at, count(*) OVER ()
      FROM onceflow.outbox_set_aside s
     WHERE s.resolved_at IS NULL
     ORDER BY s.set_aside_at, s.outbox_id
     LIMIT greatest(coalesce(max_rows, 100), 0)
$fn$;
REVOKE ALL ON FUNCTION onceflow.relay_set_aside(integer) FROM PUBLIC;

-- Retention of the operator records (pkg/retention, docs/effects.md): the
-- pruner runs with the consumer's role, which may neither delete audit rows
-- nor read set-aside rows. These two functions delete, with their owner's
-- rights, at most max_rows of the oldest rows older than keep (on the
-- database's clock) and return how many they deleted. They refuse (SQLSTATE
-- 42501) a keep shorter than a floor, so the consumer's role still cannot
-- erase a recent operator change: 30 days for the audit, 1 day for resolved
-- set-aside rows. Open set-aside rows, and audit rows still running, are never
-- deleted.
CREATE FUNCTION onceflow.prune_admin_audit(for_consumer text, keep interval, max_rows integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    n bigint;
BEGIN
    IF keep IS NULL OR keep < interval '30 days' THEN
        RAISE EXCEPTION 'onceflow.prune_admin_audit: keep % is shorter than 30 days: the audit of operator changes is kept at least that long', keep
            USING ERRCODE = '42501';
    END IF;
    DELETE FROM onceflow.admin_audit a
     WHERE a.id IN (SELECT x.id FROM onceflow.admin_audit x
                     WHERE x.consumer = for_consumer AND x.created_at < now() - keep AND x.outcome <> 'running'
                     ORDER BY x.created_at, x.id
                     LIMIT greatest(max_rows, 1));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.prune_admin_audit(text, interval, integer) FROM PUBLIC;

CREATE FUNCTION onceflow.prune_outbox_set_aside(keep interval, max_rows integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    n bigint;
BEGIN
    IF keep IS NULL OR keep < interval '1 day' THEN
        RAISE EXCEPTION 'onceflow.prune_outbox_set_aside: keep % is shorter than 1 day: resolved set-aside rows are kept at least that long', keep
            USING ERRCODE = '42501';
    END IF;
    DELETE FROM onceflow.outbox_set_aside a
     WHERE a.outbox_id IN (SELECT x.outbox_id FROM onceflow.outbox_set_aside x
                            WHERE x.resolved_at IS NOT NULL AND x.resolved_at < now() - keep
                            ORDER BY x.resolved_at, x.outbox_id
                            LIMIT greatest(max_rows, 1));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.prune_outbox_set_aside(interval, integer) FROM PUBLIC;
