ALTER TABLE onceflow.inbox DROP CONSTRAINT inbox_id_time;
ALTER TABLE onceflow.inbox ADD CONSTRAINT inbox_id_time CHECK (
    lane = 'legacy'
    OR event_id !~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
    OR event_at >= 'epoch'::timestamptz
                   + ((('x' || substr(event_id, 1, 8) || substr(event_id, 10, 4))::bit(48)::bigint) / 1000) * interval '1 second'
                   + ((('x' || substr(event_id, 1, 8) || substr(event_id, 10, 4))::bit(48)::bigint) % 1000) * interval '1 millisecond'
                   - interval '1 hour'
) NOT VALID;
DROP FUNCTION onceflow.inbox_id_time_holds(text, text, timestamptz);
