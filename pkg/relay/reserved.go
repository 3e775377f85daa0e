package relay

import (
	"errors"
)

// ErrTopicReserved: a row names a topic the relay writes itself (its
// checkpoint topic). Producers may not enqueue to it: a record under a
// shard's checkpoint key would stop that shard.
var ErrTopicReserved = errors.New("the topic is reserved by the relay (its checkpoint topic): no event may be published to it")

// qReserveTopic registers a topic in onceflow.reserved_topics (migration
// 018), where the outbox's guard refuses every insert naming it.
const qReserveTopic = `SELECT onceflow.reserve_topic($1, $2)`
