package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/outbox"
)

const validParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// sqlEnqueue calls onceflow.enqueue with the trace parameters (empty: not
// given) inside a transaction it rolls back, and returns the stored headers.
func sqlEnqueue(ctx context.Context, db *testkit.DB, headers, traceparent, tracestate string) (map[string]string, error) {
	var got map[string]string
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var id string
		if err := tx.QueryRow(ctx, `SELECT event_id FROM onceflow.enqueue('orders', 's', 't', '{}'::jsonb,
			headers => $1::jsonb, traceparent => $2, tracestate => $3)`, headers, nilIfEmpty(traceparent), nilIfEmpty(tracestate)).Scan(&id); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT headers FROM onceflow.outbox WHERE event_id = $1`, id).Scan(&got); err != nil {
			return err
		}
		return errRollback
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	return got, err
}

var errRollback = errors.New("roll back")

// onceflow.enqueue accepts the producer's trace context as two optional
// parameters and stores them as the Go API does; calls written for the
// signature without them keep working.
func TestSQLEnqueueTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, q := range []string{
		`SELECT event_id FROM onceflow.enqueue('orders', 'a', 't', '{}')`,
		`SELECT event_id FROM onceflow.enqueue('orders', 'a', 't', '{}', 'id-5')`,
		`SELECT event_id FROM onceflow.enqueue('orders', 'a', 't', '{}', 'id-7', '{"x":"1"}', 'k')`,
		`SELECT event_id FROM onceflow.enqueue('orders', 'a', 't', '{}', key => 'k2', event_id => 'id-named')`,
	} {
		var id string
		if err := b.db.Pool.QueryRow(b.ctx, q).Scan(&id); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}
	got, err := sqlEnqueue(b.ctx, b.db, `{"tenant":"acme"}`, validParent, "vendor=abc,x=1")
	if err != nil || got["traceparent"] != validParent || got["tracestate"] != "vendor=abc,x=1" || got["tenant"] != "acme" {
		t.Errorf("stored headers %v, %v", got, err)
	}
	got, err = sqlEnqueue(b.ctx, b.db, `{"tracestate":"v=1"}`, validParent, "")
	if err != nil || got["tracestate"] != "v=1" || got["traceparent"] != validParent {
		t.Errorf("tracestate in headers: stored %v, %v", got, err)
	}
	for _, tt := range []struct {
		name, headers, parent, state, want string
	}{
		{"bad traceparent", `{}`, "00-abc", "", "traceparent"},
		{"traceparent header still reserved", `{"traceparent":"` + validParent + `"}`, "", "", "headers"},
		{"tracestate without traceparent", `{}`, "", "a=1", "tracestate needs a traceparent"},
		{"header tracestate without traceparent", `{"tracestate":"a=1"}`, "", "", "tracestate needs a traceparent"},
		{"tracestate twice", `{"tracestate":"a=1"}`, validParent, "b=2", "both"},
		{"bad tracestate", `{}`, validParent, "A=1", "not a W3C tracestate"},
		{"long tracestate", `{}`, validParent, "a=" + strings.Repeat("x", 600), "over the limit of 512"},
	} {
		_, err := sqlEnqueue(b.ctx, b.db, tt.headers, tt.parent, tt.state)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22023" || !strings.Contains(pe.Message, tt.want) {
			t.Errorf("%s: %v, want SQLSTATE 22023 mentioning %q", tt.name, err, tt.want)
		}
	}
}

// The SQL function and the Go API accept and refuse the same trace
// contexts: the W3C shapes, checked twice.
func TestTraceContextChecksAgree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var many []string
	for i := range 33 {
		many = append(many, fmt.Sprintf("k%d=v", i))
	}
	cases := []struct{ parent, state, header string }{
		{validParent, "", ""},
		{validParent + "-future.fields_1", "", ""},
		{strings.ToUpper(validParent), "", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", "", ""},
		{"trace-me", "", ""},
		{validParent, "a=1", ""},
		{validParent, "a=1,b=2", ""},
		{validParent, " a=1 ,\tb=2\t", ""},
		{validParent, "a=1,,b=2", ""},
		{validParent, "a=x y", ""},
		{validParent, "a= x", ""},
		{validParent, "t@s=1", ""},
		{validParent, "1@a=1", ""},
		{validParent, "a_b-c*d/e=1", ""},
		{validParent, "1a=1", ""},
		{validParent, "aB=1", ""},
		{validParent, "A=1", ""},
		{validParent, "a=", ""},
		{validParent, "=1", ""},
		{validParent, "a", ""},
		{validParent, " ", ""},
		{validParent, "a=b=c", ""},
		{validParent, "a=1,a=2", ""},
		{validParent, "a=é", ""},
		{validParent, "a=1 x,", ""},
		{validParent, "a=" + strings.Repeat("v", 256), ""},
		{validParent, "a=" + strings.Repeat("v", 257), ""},
		{validParent, "a" + strings.Repeat("b", 255) + "=1", ""},
		{validParent, "a" + strings.Repeat("b", 256) + "=1", ""},
		{validParent, strings.Repeat("t", 241) + "@s=1", ""},
		{validParent, "t@" + strings.Repeat("s", 14) + "=1", ""},
		{validParent, strings.Join(many[:32], ","), ""},
		{validParent, strings.Join(many, ","), ""},
		{validParent, "a=" + strings.Repeat("v", 509), ""},
		{validParent, "", "a=1"},
		{validParent, "", "A=1"},
		{"", "a=1", ""},
		{"", "", "a=1"},
		{validParent, "a=1", "b=2"},
	}
	for _, c := range cases {
		m := msg("s")
		m.Traceparent, m.Tracestate = c.parent, c.state
		headers := `{}`
		if c.header != "" {
			m.Headers = map[string]string{"tracestate": c.header}
			headers = fmt.Sprintf(`{"tracestate":%q}`, c.header)
		}
		goErr := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
			if _, err := (outbox.Writer{}).Enqueue(b.ctx, tx, m); err != nil {
				return err
			}
			return errRollback
		})
		if errors.Is(goErr, errRollback) {
			goErr = nil
		}
		_, sqlErr := sqlEnqueue(b.ctx, b.db, headers, c.parent, c.state)
		if (goErr == nil) != (sqlErr == nil) {
			t.Errorf("traceparent %q tracestate %q header %q: Go says %v, SQL says %v", c.parent, trunc(c.state), c.header, goErr, sqlErr)
		}
	}
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// The migration that adds the trace parameters gives the new signature the
// grants of the old one (and back on the way down), so that producers'
// roles keep their EXECUTE right through the upgrade.
func TestEnqueueMigrationKeepsGrants(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	all, err := migrate.Load(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	var version int32
	for _, m := range all {
		if m.Name == "tracing" {
			version = int32(m.Version)
		}
	}
	if version == 0 {
		t.Fatal("no migration named tracing")
	}
	db := testkit.EmptyDB(t)
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, _, err := migrate.To(ctx, conn, version-1); err != nil {
		t.Fatal(err)
	}
	role := "onceflow_it_writer_" + strings.ReplaceAll(strings.TrimPrefix(db.Name, "onceflow_"), "-", "_")
	role = role[:min(len(role), 60)]
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s NOLOGIN`, pgx.Identifier{role}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, pgx.Identifier{role}.Sanitize()))
	})
	const old, cur = "onceflow.enqueue(text,text,text,jsonb,text,jsonb,text)", "onceflow.enqueue(text,text,text,jsonb,text,jsonb,text,text,text)"
	if _, err := conn.Exec(ctx, fmt.Sprintf(`REVOKE ALL ON FUNCTION %[1]s FROM PUBLIC; GRANT EXECUTE ON FUNCTION %[1]s TO %[2]s`,
		old, pgx.Identifier{role}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	check := func(sig string) {
		t.Helper()
		var roleMay, publicMay bool
		if err := conn.QueryRow(ctx, `SELECT has_function_privilege($1, $2::regprocedure, 'EXECUTE'),
			coalesce((SELECT bool_or(a.grantee = 0) FROM pg_proc p, aclexplode(p.proacl) a WHERE p.oid = $2::regprocedure), true)`,
			role, sig).Scan(&roleMay, &publicMay); err != nil {
			t.Fatalf("%s: %v", sig, err)
		}
		if !roleMay || publicMay {
			t.Errorf("%s: the writer may execute: %v (want true); PUBLIC may: %v (want false)", sig, roleMay, publicMay)
		}
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname = 'enqueue' AND pronamespace = 'onceflow'::regnamespace`).Scan(&n); err != nil || n != 1 {
			t.Errorf("%d onceflow.enqueue functions (%v), want 1", n, err)
		}
	}
	if _, _, err := migrate.To(ctx, conn, version); err != nil {
		t.Fatal(err)
	}
	check(cur)
	if _, _, err := migrate.To(ctx, conn, version-1); err != nil {
		t.Fatal(err)
	}
	check(old)
}
