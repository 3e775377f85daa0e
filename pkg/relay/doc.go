// Package relay publishes onceflow's transactional outbox to Kafka.
//
// A Relay polls unpublished rows in id order, publishes each batch in one
// Kafka transaction together with a checkpoint record naming the batch's
// outbox ids, and then marks the rows published. Only the relay holding its
// shard's lease (onceflow.relay_lease) publishes; others stand by and take
// over when the lease expires. A restarted or newly elected relay re-creates
// its producer under the same transactional.id, which fences the old one,
// and marks the ids of the last committed checkpoint before polling again,
// so a read_committed reader sees every committed event exactly once and each
// source in seq order.
//
// Relays of many databases may share one Kafka cluster: the default
// transactional.id and the checkpoint key derive from the database's
// identity (onceflow.database_identity), every checkpoint carries it, and a
// checkpoint is used only once proven to be this database's, row by row;
// otherwise Run stops with an *IdentityError naming the fix. A row Kafka
// refuses for good is set aside (onceflow.outbox_set_aside; the operator's
// commands over it are in package admin): only its source waits behind it.
//
// Relay is a façade over parts that each own their state: the lease
// (internal/lease), the database identity (internal/identity), recovery,
// the publisher of a term, and housekeeping. docs/architecture.md draws
// them; docs/relay.md explains the design and its trade-offs.
package relay
