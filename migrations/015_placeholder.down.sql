-- Placeholder (see 015_placeholder.up.sql).
SELECT 1;
