-- A stream's last_applied moves on with every batch. As an UPDATE of its
-- seq_state row, each move left a row version that vacuum cannot remove
-- while an old snapshot is held (an idle-in-transaction session, a long
-- report, a replication slot): every lock of the row then walked all of
-- them, and the consumer slowed down with the snapshot's age (0.36 of its
-- rate after 200k events with one REPEATABLE READ snapshot held).
--
-- Now each move inserts the new value here and deletes the previous one by
-- its exact key: a reader takes the greatest value of the stream (a
-- backward index scan that stops at the first, newest, live entry) and the
-- delete finds its one entry by key, so neither visits the versions an old
-- snapshot keeps. seq_state keeps the lock (rows are locked, no longer
-- updated per batch), first_seq, and last_applied as a floor written when a
-- stream starts: the stream's last_applied is the greater of the two.
-- One live row per stream.
CREATE TABLE onceflow.seq_applied (
    consumer     text   NOT NULL,
    source       text   NOT NULL,
    producer     text   NOT NULL,
    topic        text   NOT NULL,
    last_applied bigint NOT NULL,
    PRIMARY KEY (consumer, source, producer, topic, last_applied)
);
COMMENT ON TABLE onceflow.seq_applied IS
    'Each stream''s last_applied as it moves (one live row per stream); the stream''s value is greatest(seq_state.last_applied, max(seq_applied.last_applied)).';
