package security

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestRolesWriterCannotForgeSeq: a producer role (onceflow_writer) that
// writes the outbox by hand cannot choose a seq: a row naming none gets its
// stream's next seq from the counter, a row naming another than the next is
// refused. It cannot read, bump, wind
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
		{w, "ask a batch's next seqs (locks, moves nothing)", `SELECT * FROM onceflow.next_seqs(ARRAY['victim'], ARRAY['orders'])`, true},
	})

	// A hand-written INSERT naming seq 999, or the victim's seq 1, is
	// refused; one naming no seq gets the counter's.
	for _, q := range []string{
		`INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('forged', 'orders', 'mine', 999, 'x', '\x7b7d')`,
		`INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('as-victim', 'orders', 'victim', 1, 'x', '\x7b7d')`,
		`INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('ahead-of-victim', 'orders', 'victim', 9223372036854775807, 'x', '\x7b7d')`,
	} {
		err := execAs(ctx, db, w, q)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "23514" && pe.Code != "23505") {
			t.Errorf("%s: %s: %v, want refused (23514, or 23505 for a seq the stream has)", w, q, err)
		}
	}
	err := asRole(ctx, db, w, func(tx pgx.Tx) error {
		var seq int64
		if err := tx.QueryRow(ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload)
			VALUES ('mine-1', 'orders', 'mine', 'x', '\x7b7d') RETURNING seq`).Scan(&seq); err != nil {
			return err
		}
		if seq != 1 {
			t.Errorf("an INSERT naming no seq stored seq %d, want 1", seq)
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
