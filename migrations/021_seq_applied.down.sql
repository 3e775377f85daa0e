-- Fold each stream's newest value back into seq_state.last_applied.
UPDATE onceflow.seq_state s SET last_applied = a.last_applied
  FROM (SELECT consumer, source, producer, topic, max(last_applied) AS last_applied
          FROM onceflow.seq_applied GROUP BY 1, 2, 3, 4) a
 WHERE s.consumer = a.consumer AND s.source = a.source AND s.producer = a.producer AND s.topic = a.topic
   AND (s.last_applied IS NULL OR s.last_applied < a.last_applied);
DROP TABLE onceflow.seq_applied;
