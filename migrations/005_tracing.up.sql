-- Tracing (docs/tracing.md).

-- A given-up gap records the trace ids of the events that waited behind it
-- (the W3C trace ids of their traceparent headers, at most ten), so that an
-- on-call engineer can open the traces of the requests that produced them.
-- NULL when none of them carried a traceparent.
ALTER TABLE onceflow.seq_gaps ADD COLUMN trace_ids text[];
