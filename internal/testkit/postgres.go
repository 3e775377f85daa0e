package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/migrate/migratetest"
)

// DB is an isolated, migrated database for one test.
type DB = migratetest.Database

// NewDB creates a fresh database from a migrated template and drops it when
// the test ends. The pool is closed on cleanup too. It is the exported
// migratetest.NewDatabase on the test PostgreSQL.
func NewDB(t testing.TB) *DB {
	t.Helper()
	return migratetest.NewDatabase(t, DatabaseURL(t))
}

// EmptyDB creates a fresh database with no migrations applied.
func EmptyDB(t testing.TB) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := DatabaseURL(t)
	name := "e_" + randomHex(6) + "_" + sanitize(t.Name(), 30)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to test PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	dbURL := WithDatabase(admin, name)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, admin); err == nil {
			_, _ = c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize()))
			c.Close(ctx)
		}
	})
	return &DB{Name: name, URL: dbURL, Pool: pool}
}

// WithDatabase returns url u pointing at database name.
func WithDatabase(u, name string) string { return migratetest.WithDatabase(u, name) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func sanitize(s string, max int) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
		if b.Len() >= max {
			break
		}
	}
	return b.String()
}
