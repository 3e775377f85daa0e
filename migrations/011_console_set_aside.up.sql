-- The relay's set-aside rows on the operator console (docs/console.md).
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
