DROP FUNCTION onceflow.inbox_put_filter(text, text, timestamptz, bigint, bytea);
DROP FUNCTION onceflow.inbox_seal_bucket(text, text, timestamptz);
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT relname FROM onceflow.inbox_buckets WHERE sealed_at IS NOT NULL LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS inbox_sealed ON onceflow.%I', r.relname);
    END LOOP;
END
$$;
DROP FUNCTION onceflow.inbox_refuse_sealed();
DROP TABLE onceflow.inbox_filters;
ALTER TABLE onceflow.inbox_buckets DROP COLUMN sealed_at;
