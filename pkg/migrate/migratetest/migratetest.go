// Package migratetest gives a test a database of its own, migrated to
// onceflow's schema, on a PostgreSQL server you name: for tests of
// producers (outbox.Enqueue against the real tables and triggers) and of
// consumers (package inboxtest builds on it).
package migratetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/migrate"
	"github.com/onceflow/onceflow/pkg/schema"
)

// Database is a database of one test, migrated to onceflow's schema.
type Database struct {
	// Name of the database, URL to connect to it, and a Pool on it (closed
	// when the test ends).
	Name string
	URL  string
	Pool *pgxpool.Pool
}

var (
	templateMu sync.Mutex
	// templates are the migrated template databases this process made or
	// found, per server (DSN).
	templates = map[string]string{}
)

// NewDatabase creates a database on the server of dsn (a role that may
// create databases) as a copy of a template database holding onceflow's
// migrated schema, and drops it when the test ends. The template,
// "onceflow_tpl_<hash of the migrations>", is made once per migration set
// (test processes running at once wait for one another) and kept for the
// next run.
func NewDatabase(t testing.TB, dsn string) *Database {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tpl, err := migratedTemplate(ctx, dsn)
	if err != nil {
		t.Fatalf("migratetest: template database: %v", err)
	}
	name := "t_" + randomHex(6) + "_" + dbNamePart(t.Name(), 30)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("migratetest: connect to PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{tpl}.Sanitize())); err != nil {
		t.Fatalf("migratetest: create the test database: %v", err)
	}
	dbURL := WithDatabase(dsn, name)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("migratetest: open pool: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Logf("migratetest: drop test database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			t.Logf("migratetest: drop test database %s: %v", name, err)
		}
	})
	return &Database{Name: name, URL: dbURL, Pool: pool}
}

// WithDatabase returns dsn (a URL or keyword/value form) pointing at
// database name.
func WithDatabase(dsn, name string) string {
	pu, err := url.Parse(dsn)
	if err != nil || pu.Scheme == "" {
		return dsn + " dbname=" + name
	}
	pu.Path = "/" + name
	return pu.String()
}

func migratedTemplate(ctx context.Context, dsn string) (string, error) {
	templateMu.Lock()
	defer templateMu.Unlock()
	if name, ok := templates[dsn]; ok {
		return name, nil
	}
	name, err := buildTemplate(ctx, dsn)
	if err != nil {
		return "", err
	}
	templates[dsn] = name
	return name, nil
}

// templateLock serialises template creation across test processes.
const templateLock = 7355608

func buildTemplate(ctx context.Context, dsn string) (string, error) {
	migs, err := schema.Load(migrations.FS)
	if err != nil {
		return "", err
	}
	h := fnv.New64a()
	for _, m := range migs {
		h.Write([]byte(m.Up))
	}
	name := fmt.Sprintf("onceflow_tpl_%016x", h.Sum64())
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLock); err != nil {
		return "", fmt.Errorf("take the template lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", templateLock) //nolint:errcheck
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	// A template left half-made by a killed run is made again.
	if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	tc, err := pgx.Connect(ctx, WithDatabase(dsn, name))
	if err != nil {
		return "", err
	}
	_, _, err = migrate.Up(ctx, tc)
	tc.Close(ctx)
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s WITH is_template true", pgx.Identifier{name}.Sanitize())); err != nil {
		return "", err
	}
	return name, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// dbNamePart is s lower-cased, with every character but a-z and 0-9
// replaced by '_', cut to max bytes.
func dbNamePart(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '_'
	}, strings.ToLower(s))
	return s[:min(len(s), max)]
}
