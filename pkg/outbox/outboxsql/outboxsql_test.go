package outboxsql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/outbox/outboxsql"
)

// TestEnqueueInSQLTx: events enqueued through database/sql commit and roll
// back with the *sql.Tx, share their streams' seqs with the pgx path (one
// set of statements), batch, encode values and report a duplicate event id
// as outbox does.
func TestEnqueueInSQLTx(t *testing.T) {
	t.Parallel()
	testkit.SkipIfShort(t, "PostgreSQL")
	ctx := context.Background()
	tdb := testkit.NewDB(t)
	db, err := sql.Open("pgx", tdb.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := outbox.Message{Topic: "orders", Source: "order-1", EventType: "order.placed", Payload: []byte(`{}`)}

	inTx := func(f func(tx *sql.Tx) error, commit bool) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := f(tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		if !commit {
			return tx.Rollback()
		}
		return tx.Commit()
	}
	// Rolled back: nothing stays, no seq is burnt.
	if err := inTx(func(tx *sql.Tx) error { _, err := outboxsql.Enqueue(ctx, tx, m); return err }, false); err != nil {
		t.Fatal(err)
	}
	// pgx path, then database/sql: seqs 1 and 2 of one stream.
	if err := pgx.BeginFunc(ctx, tdb.Pool, func(tx pgx.Tx) error { _, err := outbox.Enqueue(ctx, tx, m); return err }); err != nil {
		t.Fatal(err)
	}
	var one outbox.Result
	if err := inTx(func(tx *sql.Tx) error {
		var err error
		one, err = outboxsql.Enqueue(ctx, tx, outbox.Message{Topic: m.Topic, Source: m.Source, EventType: m.EventType, EventID: "order-1:paid", Payload: []byte(`{"paid":true}`)})
		return err
	}, true); err != nil {
		t.Fatal(err)
	}
	if one.Seq != 2 || one.EventID != "order-1:paid" {
		t.Fatalf("Enqueue through database/sql: %+v, want seq 2", one)
	}
	var batch []outbox.Result
	if err := inTx(func(tx *sql.Tx) error {
		var err error
		batch, err = outboxsql.EnqueueBatch(ctx, tx, []outbox.Message{m, {Topic: "orders", Source: "order-2", EventType: "order.placed", Payload: []byte(`{}`)}, m})
		if err != nil {
			return err
		}
		_, err = outboxsql.EnqueueValue(ctx, tx, outbox.Message{Topic: "orders", Source: "order-2", EventType: "order.paid"}, map[string]int{"cents": 1250})
		return err
	}, true); err != nil {
		t.Fatal(err)
	}
	if len(batch) != 3 || batch[0].Seq != 3 || batch[1].Seq != 1 || batch[2].Seq != 4 {
		t.Fatalf("EnqueueBatch through database/sql: %+v, want seqs 3, 1, 4", batch)
	}
	err = inTx(func(tx *sql.Tx) error {
		_, err := outboxsql.Enqueue(ctx, tx, outbox.Message{Topic: m.Topic, Source: m.Source, EventType: m.EventType, EventID: "order-1:paid", Payload: []byte(`{}`)})
		return err
	}, true)
	if !errors.Is(err, outbox.ErrDuplicateEventID) {
		t.Fatalf("duplicate event id: %v, want ErrDuplicateEventID", err)
	}
	var rows, seqs int64
	if err := tdb.Pool.QueryRow(ctx, `SELECT count(*), sum(seq) FROM onceflow.outbox`).Scan(&rows, &seqs); err != nil {
		t.Fatal(err)
	}
	if rows != 6 || seqs != 1+2+3+4+1+2 {
		t.Fatalf("outbox: %d rows, seq sum %d; want 6 rows, seqs 1-4 and 1-2", rows, seqs)
	}
}
