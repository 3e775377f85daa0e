-- Placeholder (see 016_placeholder.up.sql).
SELECT 1;
