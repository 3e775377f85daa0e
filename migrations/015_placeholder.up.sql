-- Placeholder for migration 015 (branch streams-producer), so that this
-- branch's migrations have no hole. Drop this file pair when merging 015.
SELECT 1;
