package security

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/reconcile"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// TestRolesReaderReconciles: `consumer reconcile` run by a login of the
// reader role (deploy/sql/roles.sql) reads what it needs of both sides — an
// event committed, published and applied — finds it clean and records the
// run; the same role may read no payload, header or error text, and write
// nothing but run summaries.
func TestRolesReaderReconciles(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	applyRoles(t, db.URL, rs, false)
	createLogins(t, db, rs)
	topic := testkit.Topic(t, "sec-reconcile", 1, nil)

	// One event, committed, published and applied (made as the owner).
	var producer string
	var seq int64
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT id::text FROM onceflow.database_identity),
	       (onceflow.enqueue($1, 'order-1', 'order.created', '{}'::jsonb, 'ev-1')).seq`, topic).Scan(&producer, &seq); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `WITH m AS (DELETE FROM onceflow.outbox_pending RETURNING id)
	        INSERT INTO onceflow.outbox_published (first_id, last_id, ids) SELECT min(id), max(id), array_agg(id) FROM m`); err != nil {
		t.Fatal(err)
	}
	ev := envelope.Envelope{EventID: "ev-1", Source: "order-1", Seq: seq, EventType: "order.created", Producer: producer, Payload: []byte(`{}`)}
	res := testkit.Client(t).ProduceSync(ctx, ev.Record(topic))
	rec, err := res.First()
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, producer, source, seq, event_type, topic,
	        kafka_partition, kafka_offset, status, processed_at) VALUES ('c', 'ev-1', $1, 'order-1', $2, 'order.created', $3, $4, $5, 'processed', now())`,
		producer, seq, topic, rec.Partition, rec.Offset); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.consumer_offsets (group_id, topic, kafka_partition, next_offset) VALUES ('g', $1, $2, $3)`,
		topic, rec.Partition, rec.Offset+1); err != nil {
		t.Fatal(err)
	}

	pool, err := pgxpool.New(ctx, withUser(t, db.URL, login(rs.reader)))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rep, err := reconcile.Run(ctx, reconcile.Config{ConsumerPool: pool, OutboxPool: pool, Consumer: "c", Group: "g",
		KafkaOpts: []kgo.Opt{kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(t), ",")...)},
		From:      time.Now().Add(-time.Minute), Settle: -1, Topics: []string{topic}})
	if err != nil {
		t.Fatalf("reconcile as %s: %v", login(rs.reader), err)
	}
	if c := rep.Counts; !rep.Clean() || c.Committed != 1 || c.Records != 1 || c.Applied != 1 || rep.Producer != producer {
		t.Fatalf("reconcile as %s: %d anomalies %+v, counts %+v, producer %s; want clean, one event read on each side", login(rs.reader), rep.Anomalies, rep.Findings, c, rep.Producer)
	}
	if err := reconcile.Record(ctx, pool, rep); err != nil {
		t.Fatalf("record the run as %s: %v", login(rs.reader), err)
	}
	checkPrivileges(t, db, []privCase{
		{rs.reader, "read outbox payloads", outboxPayload, false},
		{rs.reader, "read outbox headers", `SELECT headers FROM onceflow.outbox`, false},
		{rs.reader, "read inbox payloads", `SELECT payload FROM onceflow.inbox`, false},
		{rs.reader, "read inbox errors", `SELECT last_error FROM onceflow.inbox`, false},
		{rs.reader, "write the outbox", outboxInsert, false},
		{rs.reader, "delete outbox rows", `DELETE FROM onceflow.outbox`, false},
		{rs.reader, "take rows off the queue", `DELETE FROM onceflow.outbox_pending`, false},
		{rs.reader, "enqueue", enqueueCall, false},
		{rs.reader, "write the inbox", inboxInsert, false},
		{rs.reader, "move a stored offset", `UPDATE onceflow.consumer_offsets SET next_offset = 0`, false},
		{rs.reader, "resolve a gap", `UPDATE onceflow.seq_gaps SET resolved_note = 'x'`, false},
		{rs.reader, "rewrite a run", `UPDATE onceflow.reconcile_runs SET anomalies = 0`, false},
		{rs.reader, "delete a run", `DELETE FROM onceflow.reconcile_runs`, false},
		{rs.reader, "read the seq state", `SELECT * FROM onceflow.seq_state`, false},
		{rs.reader, "read the run summaries", `SELECT report FROM onceflow.reconcile_runs`, true},
	})
}
