// Package outboxsql enqueues events into the outbox inside a database/sql
// transaction, for producers that use *sql.DB rather than pgx. It runs
// package outbox's own code — the same validation and the same SQL
// statements, allocating seqs the same way — through an adapter of the
// *sql.Tx, so the event commits or rolls back with the caller's writes.
//
// Open the database with pgx's database/sql driver (import
// github.com/jackc/pgx/v5/stdlib; driver name "pgx"): EnqueueBatch passes
// Go slices as PostgreSQL arrays, which that driver supports. Other drivers
// are not tested.
//
//	db, _ := sql.Open("pgx", databaseURL)
//	tx, _ := db.BeginTx(ctx, nil)
//	// … the business writes through tx …
//	res, err := outboxsql.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Source: "order-88", EventType: "order.placed", Payload: p})
//	// … then tx.Commit()
package outboxsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// Enqueue is outbox.Enqueue inside tx.
func Enqueue(ctx context.Context, tx *sql.Tx, msg outbox.Message) (outbox.Result, error) {
	return outbox.Enqueue(ctx, Tx(tx), msg)
}

// EnqueueBatch is outbox.EnqueueBatch inside tx.
func EnqueueBatch(ctx context.Context, tx *sql.Tx, msgs []outbox.Message) ([]outbox.Result, error) {
	return outbox.EnqueueBatch(ctx, Tx(tx), msgs)
}

// EnqueueValue is outbox.EnqueueValue inside tx: v encoded as JSON is the
// payload of msg.
func EnqueueValue[T any](ctx context.Context, tx *sql.Tx, msg outbox.Message, v T) (outbox.Result, error) {
	return outbox.EnqueueValue(ctx, Tx(tx), msg, v)
}

// Tx adapts tx for package outbox's functions and an outbox.Writer's
// methods (w.Enqueue(ctx, outboxsql.Tx(tx), msg)). Only the statements
// those run are supported: Exec, Query and QueryRow; Begin, Commit,
// Rollback, CopyFrom and Prepare fail with an error saying so (commit or
// roll back tx itself), and the rest of pgx.Tx panics.
func Tx(tx *sql.Tx) pgx.Tx { return sqlTx{tx: tx} }

// errUnsupported is what the adapter's other methods return.
var errUnsupported = errors.New("outboxsql: not supported on a database/sql transaction; use the *sql.Tx itself")

// sqlTx embeds a nil pgx.Tx for the methods it does not implement (they
// panic), so that it keeps compiling when pgx adds methods to the interface.
type sqlTx struct {
	pgx.Tx
	tx *sql.Tx
}

func (t sqlTx) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag(fmt.Sprintf("EXEC %d", n)), nil
}

func (t sqlTx) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	rows, err := t.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return &sqlRows{rows: rows}, nil
}

func (t sqlTx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return t.tx.QueryRowContext(ctx, query, args...)
}

func (sqlTx) Begin(context.Context) (pgx.Tx, error) { return nil, errUnsupported }
func (sqlTx) Commit(context.Context) error          { return errUnsupported }
func (sqlTx) Rollback(context.Context) error        { return errUnsupported }
func (sqlTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errUnsupported
}
func (sqlTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errUnsupported
}
func (sqlTx) Conn() *pgx.Conn { return nil }

// sqlRows adapts *sql.Rows to pgx.Rows for Next, Scan, Err and Close (the
// embedded nil pgx.Rows stands for methods pgx may add).
type sqlRows struct {
	pgx.Rows
	rows *sql.Rows
	err  error
}

func (r *sqlRows) Close() { r.setErr(r.rows.Close()) }
func (r *sqlRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.rows.Err()
}
func (r *sqlRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *sqlRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *sqlRows) Next() bool                                   { return r.rows.Next() }
func (r *sqlRows) Scan(dest ...any) error                       { return r.rows.Scan(dest...) }
func (r *sqlRows) Values() ([]any, error)                       { return nil, errUnsupported }
func (r *sqlRows) RawValues() [][]byte                          { return nil }
func (r *sqlRows) Conn() *pgx.Conn                              { return nil }
func (r *sqlRows) TypeMap() *pgtype.Map                         { return nil }

func (r *sqlRows) setErr(err error) {
	if r.err == nil {
		r.err = err
	}
}
