-- onceflow.source_refusal answers in microseconds, not a quarter of a
-- millisecond.
--
-- Every enqueue asks it once per stream (onceflow.next_seqs, and the
-- outbox_check_seq trigger for inserts that name their seqs). As a SQL
-- function with SECURITY DEFINER and its own search_path it cannot be
-- inlined, and PostgreSQL planned its query (a join of source_owners with
-- pg_roles, two NOT EXISTS, a regular expression) again at every call:
-- 0.25 ms of CPU per stream per statement, more than the rest of a
-- one-event enqueue's functions together, and the largest part of the
-- producers' CPU when they commit one event per transaction at 1k per
-- second. As PL/pgSQL its plans are kept for the session, and with
-- ownership off (no row in source_owners, the default) it answers after one
-- probe of that table. Same arguments, same answers, same rights.
CREATE OR REPLACE FUNCTION onceflow.source_refusal(source text, event_id text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_why text;
BEGIN
    -- Ownership off: nobody is refused.
    IF NOT EXISTS (SELECT 1 FROM onceflow.source_owners) THEN
        RETURN NULL;
    END IF;
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
      INTO v_why;
    RETURN v_why;
END
$fn$;
REVOKE ALL ON FUNCTION onceflow.source_refusal(text, text) FROM PUBLIC;
