// Package deploysql holds the SQL files an operator runs beside the
// migrations: roles.sql (the roles and grants) and subscriber.sql (the
// queue trigger of a producing database fed by logical replication).
package deploysql

import _ "embed"

// Subscriber is subscriber.sql: run it on a producing database whose
// outbox a logical-replication subscription writes, before the
// subscription applies its first row (docs/relay.md).
//
//go:embed subscriber.sql
var Subscriber string
