-- Placeholder on branch 'claims' only: migration 025 belongs to another
-- branch. The lead drops this file when merging (git rm).
SELECT 1;
