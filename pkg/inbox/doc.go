// Package inbox makes at-least-once Kafka delivery observationally
// exactly-once for handlers that write to PostgreSQL.
//
// A Consumer is a member of a Kafka consumer group (cooperative-sticky
// balancing, read_committed). It runs one ordered worker per assigned
// partition and applies each fetched batch of a partition in one Postgres
// transaction:
//
//  1. insert the batch's inbox rows (onceflow.inbox, key: consumer name +
//     the envelope's event-id) with INSERT … ON CONFLICT DO NOTHING
//     RETURNING; a row that already exists is a duplicate and costs one
//     index probe;
//  2. the sequence guard (package seqguard; Config.Ordering, default
//     OrderSeq): each source's events are applied in seq order; an event
//     ahead of a gap is parked in Postgres until the gap fills or its
//     timeout gives it up (a gap timer runs in every replica), an event
//     behind a given-up gap is delivered with Event.Late set or held;
//     OrderArrival applies events as they arrive;
//  3. the Handler (or BatchHandler) for the events the guard releases, in
//     order, with the transaction, so its writes commit with the inbox rows;
//  4. the partition's next offset (onceflow.consumer_offsets);
//
// then commits, and only then commits the offset to Kafka. A crash anywhere
// before the Postgres commit loses nothing (the batch is fetched again and
// re-applied); a crash after it applies nothing twice (the inbox rows exist,
// and on reassignment the consumer seeks to the offset stored in Postgres).
// On revocation a partition's worker finishes its in-flight batch before the
// partition is given up.
//
// When the handler fails, the batch is rolled back and re-run one event per
// transaction: the failing event is retried with exponential backoff and then
// dead-lettered (inbox status "dead", with the error, attempts, headers and
// payload kept for Replay), and the partition moves on. Records that
// break the envelope contract (see package envelope) are dead-lettered at
// once under the key "malformed:<topic>:<topic id>:<partition>:<offset>".
//
// Handlers need no Go code when configured with a handler file (package
// handlerfile): "sql" runs a statement with named parameters per event type,
// "log" only records the event in the inbox, "http" calls a URL fenced by
// the effects ledger.
//
// See docs/consumer.md for operations, configuration and measurements.
package inbox
