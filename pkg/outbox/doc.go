// Package outbox writes events into onceflow's transactional outbox: it is
// the producer API.
//
// Producers call Enqueue (or EnqueueBatch) inside their own pgx transaction:
// the event is published if and only if that transaction commits. Each event
// gets a per-source seq that is gap-free and, per source, in commit order.
// Producers in other languages call the SQL function onceflow.enqueue.
//
// The package links only pgx, the envelope's rules and OpenTelemetry's
// trace API. Publishing the outbox to Kafka is the relay's job (package
// relay); docs/relay.md explains the design and its trade-offs.
package outbox
