-- Placeholder for migration 016, which another branch of issue 26 adds; the
-- merge replaces this file with that branch's (delete this one).
SELECT 1;
