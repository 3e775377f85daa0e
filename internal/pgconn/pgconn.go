// Package pgconn builds the binaries' PostgreSQL pools.
package pgconn

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config holds the database settings shared by both binaries.
type Config struct {
	// URL is a libpq connection string or URL (required).
	URL string
	// MaxConns bounds the pool (default 10).
	MaxConns int
}

// RegisterFlags registers -database-url and -database-max-conns.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "database-url", "", "PostgreSQL connection URL (required)")
	fs.IntVar(&c.MaxConns, "database-max-conns", 10, "maximum connections in the pool")
}

// Validate names the bad setting.
func (c *Config) Validate() error {
	if c.URL == "" {
		return errors.New("-database-url (ONCEFLOW_DATABASE_URL) is required")
	}
	if _, err := pgxpool.ParseConfig(c.URL); err != nil {
		return fmt.Errorf("-database-url (ONCEFLOW_DATABASE_URL): %v", err)
	}
	if c.MaxConns < 1 {
		return fmt.Errorf("-database-max-conns (ONCEFLOW_DATABASE_MAX_CONNS) must be at least 1, got %d", c.MaxConns)
	}
	return nil
}

// Pool opens a pool named appName (shown in pg_stat_activity).
func (c *Config) Pool(ctx context.Context, appName string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %v", err)
	}
	pc.MaxConns = int32(c.MaxConns)
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = appName
	}
	return pgxpool.NewWithConfig(ctx, pc)
}

// Conn opens a single connection (for migrations).
func (c *Config) Conn(ctx context.Context, appName string) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %v", err)
	}
	cc.RuntimeParams["application_name"] = appName
	return pgx.ConnectConfig(ctx, cc)
}

// (pgx's parse errors already redact the password.)
