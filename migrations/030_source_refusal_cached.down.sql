-- Back to the SQL function of migration 018.
CREATE OR REPLACE FUNCTION onceflow.source_refusal(source text, event_id text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    WITH mine AS (
        SELECT o.source_prefix FROM onceflow.source_owners o JOIN pg_roles r ON r.rolname = o.role
         WHERE pg_has_role(session_user, r.oid, 'MEMBER')
    )
    SELECT CASE
        -- A superuser is a member of every role, and could drop the guard.
        WHEN (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = session_user) THEN NULL
        WHEN NOT EXISTS (SELECT 1 FROM mine) THEN NULL
        WHEN NOT EXISTS (SELECT 1 FROM mine WHERE starts_with(source_refusal.source, mine.source_prefix)) THEN
            format('source %s is not one of role %s''s (onceflow.source_owners)', quote_literal(left(source_refusal.source, 80)), session_user)
        WHEN source_refusal.event_id IS NOT NULL
         AND source_refusal.event_id !~ '^[0-9a-f]{8}-[0-9a-f]{4}-[47][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
         AND NOT EXISTS (SELECT 1 FROM mine WHERE starts_with(source_refusal.event_id, mine.source_prefix)) THEN
            format('event_id %s is neither a UUID nor under one of role %s''s source prefixes (onceflow.source_owners)',
                   quote_literal(left(source_refusal.event_id, 80)), session_user)
    END
$fn$;
REVOKE ALL ON FUNCTION onceflow.source_refusal(text, text) FROM PUBLIC;
