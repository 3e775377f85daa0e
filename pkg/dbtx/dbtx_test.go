package dbtx_test

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// Every handle a caller may hold satisfies DB.
var (
	_ dbtx.DB = pgx.Tx(nil)
	_ dbtx.DB = (*pgx.Conn)(nil)
	_ dbtx.DB = (*pgxpool.Pool)(nil)
	_ dbtx.DB = (*pgxpool.Conn)(nil)
)
