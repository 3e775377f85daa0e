package testkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/migrations"
)

var (
	templateMu sync.Mutex
	// templates are the migrated template databases made by this process,
	// per server (admin URL).
	templates = map[string]string{}
)

// DB is an isolated, migrated database for one test.
type DB struct {
	Name string
	URL  string
	Pool *pgxpool.Pool
}

// NewDB creates a fresh database from a migrated template and drops it when
// the test ends. The pool is closed on cleanup too.
func NewDB(t testing.TB) *DB {
	t.Helper()
	return NewDBAt(t, DatabaseURL(t))
}

// NewDBAt is NewDB on the server of admin, a URL of a role that may create
// databases (package inboxtest gives its users' URL).
func NewDBAt(t testing.TB, admin string) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tpl, err := migratedTemplate(ctx, admin)
	if err != nil {
		t.Fatalf("test database template: %v", err)
	}
	name := "t_" + randomHex(6) + "_" + sanitize(t.Name(), 30)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to test PostgreSQL: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{tpl}.Sanitize())); err != nil {
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
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Logf("drop test database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	return &DB{Name: name, URL: dbURL, Pool: pool}
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
func WithDatabase(u, name string) string {
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme == "" {
		// keyword/value form
		return u + " dbname=" + name
	}
	pu.Path = "/" + name
	return pu.String()
}

// migratedTemplate creates (once per migration set, shared across test
// processes) a template database holding the migrated schema.
func migratedTemplate(ctx context.Context, admin string) (string, error) {
	templateMu.Lock()
	defer templateMu.Unlock()
	if name, ok := templates[admin]; ok {
		return name, nil
	}
	name, err := buildTemplate(ctx, admin)
	if err != nil {
		return "", err
	}
	templates[admin] = name
	return name, nil
}

func buildTemplate(ctx context.Context, admin string) (string, error) {
	migs, err := migrate.Load(migrations.FS)
	if err != nil {
		return "", err
	}
	var all strings.Builder
	for _, m := range migs {
		all.WriteString(m.Up)
	}
	name := "onceflow_tpl_" + shortHash(all.String())
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	// Serialise template creation across parallel test binaries.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(7355608)"); err != nil {
		return "", err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(7355608)") //nolint:errcheck
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	_, _ = conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize()))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	tc, err := pgx.Connect(ctx, WithDatabase(admin, name))
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

func shortHash(s string) string {
	// FNV-1a, 64 bit: enough to tell migration sets apart.
	var h uint64 = 14695981039346656037
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return fmt.Sprintf("%016x", h)
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
