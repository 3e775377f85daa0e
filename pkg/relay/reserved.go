package relay

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTopicReserved: a row names a topic the relay writes itself (its
// checkpoint topic). Producers may not enqueue to it: a record under a
// shard's checkpoint key would stop that shard.
var ErrTopicReserved = errors.New("the topic is reserved by the relay (its checkpoint topic): no event may be published to it")

// qReserveTopic registers a topic in onceflow.reserved_topics (migration
// 018), where the outbox's guard refuses every insert naming it.
const qReserveTopic = `SELECT onceflow.reserve_topic($1, $2)`

// reserveTopics registers the relay's checkpoint topic as reserved, so that
// the database refuses events for it from every producer. A database
// without onceflow.reserve_topic (not yet migrated) or a role without
// EXECUTE on it is logged and tolerated: the relay still refuses such rows
// itself (reservedRow).
func (r *Relay) reserveTopics(ctx context.Context) {
	if _, err := r.cfg.DB.Exec(ctx, qReserveTopic, r.cfg.CheckpointTopic, "relay checkpoints"); err != nil && ctx.Err() == nil {
		var pe *pgconn.PgError
		hint := ""
		if errors.As(err, &pe) && (pe.Code == "42883" || pe.Code == "42501") {
			hint = "run the migrations and deploy/sql/roles.sql: the database cannot refuse producers' events for the checkpoint topic until then"
		}
		r.log.WarnContext(ctx, "register the checkpoint topic as reserved", slog.String("topic", r.cfg.CheckpointTopic),
			slog.Any("error", err), slog.String("fix", hint))
	}
}

// reservedRow is the relay's own line behind the database's: the index of
// the first row whose topic is the relay's checkpoint topic, with an error
// naming it; -1 and nil when there is none.
func (r *Relay) reservedRow(rows []row) (int, error) {
	for i, w := range rows {
		if w.topic == r.cfg.CheckpointTopic {
			return i, &TopicError{Topic: w.topic, Err: ErrTopicReserved}
		}
	}
	return -1, nil
}
