-- Placeholder on branch 'claims' only (see the up file).
SELECT 1;
