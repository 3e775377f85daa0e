package security

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestRolesWriterCannotForgeSeq: a producer role (onceflow_writer) that
// writes the outbox by hand cannot choose a seq: the row gets its stream's
// next seq from the counter, whatever it named. It cannot read, bump, wind
// back, max out, delete, truncate or lock the counters (of its own streams
// or another source's), old or new, so another source's next seq stays
// what its counter says.
func TestRolesWriterCannotForgeSeq(t *testing.T) {
	t.Parallel()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	ctx := context.Background()
	applyRoles(t, db.URL, rs, false)
	w := rs.writer

	// The victim: another source with three events.
	for range 3 {
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Source: "victim", EventType: "x", Payload: []byte(`{}`)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}

	checkPrivileges(t, db, []privCase{
		{w, "read the counters", `SELECT * FROM onceflow.source_seq`, false},
		{w, "wind back a counter", `UPDATE onceflow.source_seq SET last_seq = 0 WHERE source = 'victim'`, false},
		{w, "max out a counter", `UPDATE onceflow.source_seq SET last_seq = 9223372036854775807 WHERE source = 'victim'`, false},
		{w, "create a counter", `INSERT INTO onceflow.source_seq (source, topic, last_seq) VALUES ('victim', 'emails', 9223372036854775807)`, false},
		{w, "delete a counter", `DELETE FROM onceflow.source_seq WHERE source = 'victim'`, false},
		{w, "truncate the counters", `TRUNCATE onceflow.source_seq`, false},
		{w, "lock a counter (FOR UPDATE)", `SELECT 1 FROM onceflow.source_seq WHERE source = 'victim' FOR UPDATE`, false},
		{w, "lock a counter (FOR KEY SHARE)", `SELECT 1 FROM onceflow.source_seq WHERE source = 'victim' FOR KEY SHARE`, false},
		{w, "lock the counters' table", `LOCK TABLE onceflow.source_seq IN EXCLUSIVE MODE`, false},
		{w, "bump a legacy counter", `UPDATE onceflow.source_seq_legacy SET last_seq = 0`, false},
		{w, "read the legacy counters", `SELECT * FROM onceflow.source_seq_legacy`, false},
		{w, "call the seq trigger's function", `SELECT onceflow.outbox_assign_seq()`, false},
	})

	// A hand-written INSERT naming seq 999 (and one naming the victim's next
	// seq, 4, on the victim's stream) gets the counter's seq.
	err := asRole(ctx, db, w, func(tx pgx.Tx) error {
		var forged, victim int64
		if err := tx.QueryRow(ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload)
			VALUES ('forged', 'orders', 'mine', 999, 'x', '\x7b7d') RETURNING seq`).Scan(&forged); err != nil {
			return err
		}
		if forged != 1 {
			t.Errorf("an INSERT naming seq 999 stored seq %d, want 1 (the counter's)", forged)
		}
		if err := tx.QueryRow(ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload)
			VALUES ('as-victim', 'orders', 'victim', 1, 'x', '\x7b7d') RETURNING seq`).Scan(&victim); err != nil {
			return err
		}
		if victim != 4 {
			t.Errorf("an INSERT naming seq 1 on the victim's stream stored seq %d, want 4 (the counter's)", victim)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: hand-written INSERT: %v", w, err)
	}

	// The victim's stream goes on from its counter.
	var next int64
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		r, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Source: "victim", EventType: "x", Payload: []byte(`{}`)})
		next = r.Seq
		return err
	}); err != nil || next != 4 {
		t.Fatalf("the victim's next seq: %d (%v), want 4", next, err)
	}
}
