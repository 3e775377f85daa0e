// Package dbtx names the one PostgreSQL handle the onceflow libraries take.
//
// A pgx.Tx, a *pgx.Conn, a *pgxpool.Pool and a *pgxpool.Conn all satisfy
// DB, so a caller passes whichever it holds: a function that must run in
// the caller's transaction takes a pgx.Tx instead, and one that must hold
// one connection for a session-level lock takes a *pgxpool.Pool.
//
// The package imports only pgx and pgconn.
package dbtx

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB runs statements and opens transactions (a savepoint when the handle
// is itself a transaction).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
