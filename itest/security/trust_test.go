package security

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// The attacks of issue 27, each made as the role an attacker would hold:
// a producer login (a member of the writer role), the consumer's role.

// loginPool connects as the login member of role.
func loginPool(t *testing.T, db *testkit.DB, user string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), withUser(t, db.URL, user))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// exec runs sql in a transaction of its own on pool and rolls it back.
func execRolledBack(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, sql, args...)
	return err
}

// copyRolledBack stores one outbox row with COPY and rolls it back.
func copyRolledBack(ctx context.Context, pool *pgxpool.Pool, topic string, headers string, key, payload []byte) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.CopyFrom(ctx, pgx.Identifier{"onceflow", "outbox"},
		[]string{"event_id", "topic", "source", "seq", "event_type", "record_key", "headers", "payload"},
		pgx.CopyFromRows([][]any{{"copy-" + randHex(4), topic, "copy-src", int64(1), "x.y", key, headers, payload}}))
	return err
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// TestTrustOutboxRefusesBadRows: no path open to a producer login stores a
// row that onceflow.enqueue would refuse: oversized payload, headers or key,
// an illegal topic name, or a topic the relay reserved (its checkpoint
// topic) — through INSERT, COPY, enqueue() and enqueue_batch().
func TestTrustOutboxRefusesBadRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	applyRoles(t, db.URL, rs, false)
	createLogins(t, db, rs)
	if err := execAs(ctx, db, rs.relay, `SELECT onceflow.reserve_topic('onceflow.relay.checkpoints', 'relay checkpoints')`); err != nil {
		t.Fatalf("relay registers its checkpoint topic: %v", err)
	}
	// execAs rolls back: register it for good.
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.reserve_topic('onceflow.relay.checkpoints', 'relay checkpoints')`); err != nil {
		t.Fatal(err)
	}
	w := loginPool(t, db, login(rs.writer))

	big := strings.Repeat("x", 1<<20) // a JSON string of 1 MiB + 2 bytes
	longHeader := strings.Repeat("h", 8200)
	cases := []struct {
		what           string
		topic, headers string
		key            []byte
		payload        []byte
		enqueue, batch string // SQL; empty: not expressible through the function
		enqueueArgs    []any
		batchArg       string
	}{
		{what: "payload over 1 MiB", topic: "orders", headers: "{}", payload: []byte(`"` + big + `"`),
			enqueue: `SELECT onceflow.enqueue('orders', 's', 'x.y', to_jsonb($1::text))`, enqueueArgs: []any{big},
			batchArg: `[{"topic": "orders", "source": "s", "event_type": "x.y", "payload": "` + big + `"}]`},
		{what: "reserved header name", topic: "orders", headers: `{"seq": "1"}`, payload: []byte(`{}`),
			enqueue:  `SELECT onceflow.enqueue('orders', 's', 'x.y', '{}'::jsonb, headers => '{"seq": "1"}')`,
			batchArg: `[{"topic": "orders", "source": "s", "event_type": "x.y", "payload": {}, "headers": {"seq": "1"}}]`},
		{what: "header over 8 KiB", topic: "orders", headers: `{"h": "` + longHeader + `"}`, payload: []byte(`{}`),
			enqueue:  `SELECT onceflow.enqueue('orders', 's', 'x.y', '{}'::jsonb, headers => jsonb_build_object('h', repeat('h', 8200)))`,
			batchArg: `[{"topic": "orders", "source": "s", "event_type": "x.y", "payload": {}, "headers": {"h": "` + longHeader + `"}}]`},
		{what: "headers not an object of strings", topic: "orders", headers: `{"n": 1}`, payload: []byte(`{}`),
			enqueue:  `SELECT onceflow.enqueue('orders', 's', 'x.y', '{}'::jsonb, headers => '{"n": 1}')`,
			batchArg: `[{"topic": "orders", "source": "s", "event_type": "x.y", "payload": {}, "headers": {"n": 1}}]`},
		{what: "key over 8 KiB", topic: "orders", headers: "{}", key: []byte(strings.Repeat("k", 9000)), payload: []byte(`{}`),
			enqueue:  `SELECT onceflow.enqueue('orders', 's', 'x.y', '{}'::jsonb, key => repeat('k', 9000))`,
			batchArg: `[{"topic": "orders", "source": "s", "event_type": "x.y", "payload": {}, "key": "` + strings.Repeat("k", 9000) + `"}]`},
		{what: "illegal topic name", topic: "orders/eu", headers: "{}", payload: []byte(`{}`),
			enqueue:  `SELECT onceflow.enqueue('orders/eu', 's', 'x.y', '{}'::jsonb)`,
			batchArg: `[{"topic": "orders/eu", "source": "s", "event_type": "x.y", "payload": {}}]`},
		{what: "topic '..'", topic: "..", headers: "{}", payload: []byte(`{}`),
			enqueue:  `SELECT onceflow.enqueue('..', 's', 'x.y', '{}'::jsonb)`,
			batchArg: `[{"topic": "..", "source": "s", "event_type": "x.y", "payload": {}}]`},
		{what: "topic over 249 bytes", topic: strings.Repeat("t", 250), headers: "{}", payload: []byte(`{}`),
			enqueue:  `SELECT onceflow.enqueue(repeat('t', 250), 's', 'x.y', '{}'::jsonb)`,
			batchArg: `[{"topic": "` + strings.Repeat("t", 250) + `", "source": "s", "event_type": "x.y", "payload": {}}]`},
		{what: "the relay's checkpoint topic", topic: "onceflow.relay.checkpoints", headers: "{}", payload: []byte(`{}`),
			enqueue:  `SELECT onceflow.enqueue('onceflow.relay.checkpoints', 's', 'x.y', '{}'::jsonb)`,
			batchArg: `[{"topic": "onceflow.relay.checkpoints", "source": "s", "event_type": "x.y", "payload": {}}]`},
	}
	for _, c := range cases {
		insert := `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, record_key, headers, payload)
			VALUES ('ins-1', $1, 'ins-src', 1, 'x.y', $2, $3::jsonb, $4)`
		if err := execRolledBack(ctx, w, insert, c.topic, c.key, c.headers, c.payload); err == nil {
			t.Errorf("%s: direct INSERT as %s stored the row", c.what, login(rs.writer))
		} else {
			t.Logf("%s: INSERT refused: %v", c.what, err)
		}
		if err := copyRolledBack(ctx, w, c.topic, c.headers, c.key, c.payload); err == nil {
			t.Errorf("%s: COPY as %s stored the row", c.what, login(rs.writer))
		}
		if err := execRolledBack(ctx, w, c.enqueue, c.enqueueArgs...); err == nil {
			t.Errorf("%s: onceflow.enqueue as %s stored the row", c.what, login(rs.writer))
		}
		if err := execRolledBack(ctx, w, `SELECT * FROM onceflow.enqueue_batch($1::jsonb)`, c.batchArg); err == nil {
			t.Errorf("%s: onceflow.enqueue_batch as %s stored the row", c.what, login(rs.writer))
		}
	}
	// A good row still goes in, every way.
	for _, q := range []string{enqueueCall, enqueueBatchCall, `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload, headers)
		VALUES ('ok-1', 'orders', 'ok-src', 1, 'x.y', '\x7b7d', '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tenant": "eu"}')`} {
		if err := execRolledBack(ctx, w, q); err != nil {
			t.Errorf("good row refused: %s: %v", q, err)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.outbox`); n != 0 {
		t.Fatalf("%d rows in the outbox after the attempts, want 0", n)
	}
}

func count(t *testing.T, db *testkit.DB, q string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestTrustSourceOwnership: with rows in onceflow.source_owners, a producer
// login may enqueue only its own sources (and supply only its own event
// ids or UUIDs), on every path, even after SET ROLE; a refused attempt
// leaves no lock on the other team's counter, so it cannot block them.
func TestTrustSourceOwnership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	applyRoles(t, db.URL, rs, false)
	teamA, teamB := rs.writer+"_team_a", rs.writer+"_team_b"
	for _, u := range []string{teamA, teamB} {
		if _, err := db.Pool.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN IN ROLE %s", u, rs.writer)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pgxConnExec(db.URL, "DROP ROLE IF EXISTS "+u) })
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.source_owners (role, source_prefix) VALUES ($1, 'a/'), ($2, 'b/')`, teamA, teamB); err != nil {
		t.Fatal(err)
	}
	a, b := loginPool(t, db, teamA), loginPool(t, db, teamB)

	refused := []struct{ what, sql string }{
		{"enqueue another team's source", `SELECT onceflow.enqueue('orders', 'b/order-1', 'x.y', '{}'::jsonb)`},
		{"enqueue_batch another team's source", `SELECT * FROM onceflow.enqueue_batch('[{"topic": "orders", "source": "b/order-1", "event_type": "x.y", "payload": {}}]')`},
		{"INSERT into another team's source", `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('a/e1', 'orders', 'b/order-1', 99, 'x.y', '\x7b7d')`},
		{"take another team's event id", `SELECT onceflow.enqueue('orders', 'a/order-1', 'x.y', '{}'::jsonb, event_id => 'b/order-1/created')`},
		{"enqueue another team's source after SET ROLE", `SET LOCAL ROLE ` + rs.writer + `; SELECT onceflow.enqueue('orders', 'b/order-1', 'x.y', '{}'::jsonb)`},
		{"enqueue a source of no team", `SELECT onceflow.enqueue('orders', 'c/order-1', 'x.y', '{}'::jsonb)`},
		{"lock another team's counter through next_seqs", `SELECT * FROM onceflow.next_seqs(ARRAY['b/order-1'], ARRAY['orders'])`},
	}
	for _, c := range refused {
		err := execRolledBack(ctx, a, c.sql)
		if sqlState(err) != "42501" {
			t.Errorf("%s as %s: want refused (42501), got %v", c.what, teamA, err)
		} else {
			t.Logf("%s: %v", c.what, err)
		}
	}
	for _, q := range []string{
		`SELECT onceflow.enqueue('orders', 'a/order-1', 'x.y', '{}'::jsonb)`,
		`SELECT onceflow.enqueue('orders', 'a/order-1', 'x.y', '{}'::jsonb, event_id => 'a/order-1/created')`,
		`SELECT onceflow.enqueue('orders', 'a/order-1', 'x.y', '{}'::jsonb, event_id => '0190b0f4-4c7e-7a3b-9c2d-1e2f3a4b5c6d')`,
	} {
		if err := execRolledBack(ctx, a, q); err != nil {
			t.Errorf("own source refused: %s: %v", q, err)
		}
	}

	// Blocking: team A's refused enqueue of b/order-1 stays in an open
	// (aborted) transaction; team B still enqueues b/order-1 at once.
	atx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer atx.Rollback(ctx) //nolint:errcheck
	if _, err := atx.Exec(ctx, `SELECT onceflow.enqueue('orders', 'b/order-1', 'x.y', '{}'::jsonb)`); sqlState(err) != "42501" {
		t.Fatalf("team A enqueues b/order-1: %v", err)
	}
	btx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer btx.Rollback(ctx) //nolint:errcheck
	if _, err := btx.Exec(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := btx.Exec(ctx, `SELECT onceflow.enqueue('orders', 'b/order-1', 'x.y', '{}'::jsonb)`); err != nil {
		t.Fatalf("team B blocked on its own source by team A's refused attempt: %v", err)
	}
	if err := btx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// The same with b/order-1's counter already there: team A asks
	// next_seqs (which would lock it and return) inside a transaction it
	// keeps open on a savepoint; team B still enqueues at once.
	atx2, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer atx2.Rollback(ctx) //nolint:errcheck
	if _, err := atx2.Exec(ctx, `SAVEPOINT s`); err != nil {
		t.Fatal(err)
	}
	if _, err := atx2.Exec(ctx, `SELECT * FROM onceflow.next_seqs(ARRAY['b/order-1'], ARRAY['orders'])`); sqlState(err) != "42501" {
		t.Fatalf("team A locks b/order-1's counter through next_seqs: %v", err)
	}
	if _, err := atx2.Exec(ctx, `ROLLBACK TO SAVEPOINT s`); err != nil {
		t.Fatal(err)
	}
	btx2, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer btx2.Rollback(ctx) //nolint:errcheck
	if _, err := btx2.Exec(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
		t.Fatal(err)
	}
	if _, err := btx2.Exec(ctx, `SELECT onceflow.enqueue('orders', 'b/order-1', 'x.y', '{}'::jsonb)`); err != nil {
		t.Fatalf("team B blocked on its own counter by team A's next_seqs: %v", err)
	}
}

func pgxConnExec(u, sql string) (pgconn.CommandTag, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer conn.Close(ctx)
	return conn.Exec(ctx, sql)
}

// TestTrustAuditAppendOnly: the consumer's role cannot rewrite or erase the
// operator audit: a supplied created_at is replaced by the database's
// clock; created_at, note, actor cannot be updated; a finished change
// cannot be finished again; rows cannot be deleted; and prune_admin_audit
// keeps a fresh row (the backdate-then-prune attack).
func TestTrustAuditAppendOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	applyRoles(t, db.URL, rs, false)
	createLogins(t, db, rs)
	c := loginPool(t, db, login(rs.consumer))
	var id int64
	var created time.Time
	if err := c.QueryRow(ctx, `INSERT INTO onceflow.admin_audit (request_id, consumer, action, actor, via, params, outcome, created_at)
		VALUES ('r1', 'c', 'dlq.replay', 'alice', 'cli', '{}', 'running', '2001-01-01') RETURNING id, created_at`).Scan(&id, &created); err != nil {
		t.Fatal(err)
	}
	if time.Since(created) > time.Hour {
		t.Errorf("created_at %s: the supplied time was kept, want the database's clock", created)
	}
	for _, q := range []string{
		`UPDATE onceflow.admin_audit SET created_at = '2001-01-01'`,
		`UPDATE onceflow.admin_audit SET note = 'nothing happened'`,
		`UPDATE onceflow.admin_audit SET actor = 'mallory'`,
		`DELETE FROM onceflow.admin_audit`,
	} {
		if _, err := c.Exec(ctx, q); sqlState(err) != "42501" {
			t.Errorf("as %s: %s: want refused (42501), got %v", login(rs.consumer), q, err)
		}
	}
	if _, err := c.Exec(ctx, `UPDATE onceflow.admin_audit SET outcome = 'ok', result = '{"replayed": 3}' WHERE id = $1`, id); err != nil {
		t.Fatalf("finish a running change: %v", err)
	}
	if _, err := c.Exec(ctx, `UPDATE onceflow.admin_audit SET outcome = 'partial', result = '{"replayed": 0}' WHERE id = $1`, id); sqlState(err) != "42501" {
		t.Errorf("finish a finished change again: want refused (42501), got %v", err)
	}
	var n int64
	if err := c.QueryRow(ctx, `SELECT onceflow.prune_admin_audit('c', '30 days', 100)`).Scan(&n); err != nil || n != 0 {
		t.Errorf("prune_admin_audit of a fresh row: pruned %d, %v; want 0", n, err)
	}
	if got := count(t, db, `SELECT count(*) FROM onceflow.admin_audit WHERE created_at > now() - interval '1 hour' AND outcome = 'ok'`); got != 1 {
		t.Errorf("%d fresh finished audit rows, want 1", got)
	}
}

// TestTrustPlantedFunction: a convert_to(text, text) planted in a schema
// the writer may create in, first on its search_path, is not called by
// onceflow.enqueue or enqueue_batch.
func TestTrustPlantedFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	applyRoles(t, db.URL, rs, false)
	createLogins(t, db, rs)
	for _, q := range []string{
		`CREATE SCHEMA planted`,
		`GRANT USAGE, CREATE ON SCHEMA planted TO ` + rs.writer,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	w := loginPool(t, db, login(rs.writer))
	if _, err := w.Exec(ctx, `CREATE FUNCTION planted.convert_to(t text, enc text) RETURNS bytea LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'planted convert_to called as %', current_user; END $$`); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{enqueueCall, enqueueBatchCall} {
		err := execRolledBack(ctx, w, `SET LOCAL search_path = planted, public; `+q)
		if err != nil {
			t.Errorf("%s with planted.convert_to on the search_path: %v", q, err)
		}
	}
	// onceflow.source_shard (no SET clause, so that it inlines) with a
	// planted md5 ahead of pg_catalog, as the relay calls it.
	if _, err := w.Exec(ctx, `CREATE FUNCTION planted.md5(t text) RETURNS text LANGUAGE sql AS $$ SELECT 'ffffffffffffffffffffffffffffffff' $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `GRANT USAGE ON SCHEMA planted TO `+rs.relay); err != nil {
		t.Fatal(err)
	}
	r := loginPool(t, db, login(rs.relay))
	var clean, planted int
	if err := r.QueryRow(ctx, `SELECT onceflow.source_shard('order-1', 7)`).Scan(&clean); err != nil {
		t.Fatal(err)
	}
	tx, err := r.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SET LOCAL search_path = planted, pg_catalog`); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, `SELECT onceflow.source_shard(source, 7) FROM (VALUES ('order-1')) AS v(source)`).Scan(&planted); err != nil {
		t.Fatal(err)
	}
	if planted != clean {
		t.Errorf("source_shard('order-1', 7) is %d with planted.md5 first on the search_path, %d without", planted, clean)
	}
}

// TestTrustFutureFunctionsNotPublic: a function that a later migration
// creates, as the role that runs the migrations (a login of the owner
// role, or a superuser), is not executable by PUBLIC nor by a writer.
func TestTrustFutureFunctionsNotPublic(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs := newRoles(t)
	db := testkit.EmptyDB(t)
	applyRoles(t, db.URL, rs, false)
	createLogins(t, db, rs)
	conn, err := pgx.Connect(ctx, withUser(t, db.URL, login(rs.owner)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, _, err := migrate.Up(ctx, conn); err != nil {
		t.Fatalf("migrate as %s: %v", login(rs.owner), err)
	}
	applyRoles(t, db.URL, rs, false)
	// "A later migration", by the migrating login and by the owner role.
	for _, q := range []string{
		`CREATE FUNCTION onceflow.later_by_login() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
		`SET ROLE ` + rs.owner + `; CREATE FUNCTION onceflow.later_by_owner() RETURNS int LANGUAGE sql AS 'SELECT 1'; RESET ROLE`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, fn := range []string{"onceflow.later_by_login()", "onceflow.later_by_owner()"} {
		var public, writer bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
			WHERE p.oid = $1::regprocedure AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'),
			has_function_privilege($2, $1::regprocedure, 'EXECUTE')`, fn, login(rs.writer)).Scan(&public, &writer); err != nil {
			t.Fatal(err)
		}
		if public || writer {
			t.Errorf("%s: executable by PUBLIC %v, by %s %v; want neither", fn, public, login(rs.writer), writer)
		}
	}
}

// TestTrustReplayInterrupted: a bulk replay records its intent (request
// id, filter, how many events match) in a committed row before the first
// event is applied. Its session is killed part-way (pg_terminate_backend
// of the connection that holds the request): the intent is there, and a
// retry with the same request id does not replay again; it finishes the
// row as interrupted and reports the intent's count truthfully.
func TestTrustReplayInterrupted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testkit.NewDB(t)
	const events = 20
	for i := range events {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status)
			VALUES ('default', $1, $2, 1, 'x.y', 'orders', 0, $3, 'dead')`, fmt.Sprintf("ev-%02d", i), fmt.Sprintf("src-%02d", i), i); err != nil {
			t.Fatal(err)
		}
	}
	var applied sync.Map
	release := make(chan struct{})
	reached := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	n := 0
	replay := func(ctx context.Context, id string) (inbox.ReplayResult, error) {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		if k == 6 {
			once.Do(func() { close(reached) })
			<-release
		}
		if _, err := db.Pool.Exec(ctx, `UPDATE onceflow.inbox SET status = 'processed' WHERE event_id = $1`, id); err != nil {
			return "", err
		}
		applied.Store(id, true)
		return inbox.Replayed, nil
	}
	svc, err := admin.NewService(admin.Config{Pool: db.Pool, Replay: replay, ReplayParallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	req := admin.ReplayRequest{RequestID: "replay-kill-1", Note: "fixed the handler", All: true}
	caller := admin.Caller{Actor: "alice", Via: "cli"}
	done := make(chan error, 1)
	go func() {
		_, err := svc.Replay(ctx, caller, req)
		done <- err
	}()
	select {
	case <-reached:
	case <-ctx.Done():
		t.Fatal("the replay did not reach its 6th event")
	}
	// Five events are applied: the intent is committed and visible.
	var outcome string
	var matched int
	if err := db.Pool.QueryRow(ctx, `SELECT outcome, coalesce((result->>'matched')::int, -1) FROM onceflow.admin_audit WHERE request_id = $1`, req.RequestID).
		Scan(&outcome, &matched); err != nil {
		t.Fatalf("the intent of a replay that has applied 5 events is not in the audit: %v", err)
	}
	if outcome != "running" || matched != events {
		t.Fatalf("intent: outcome %s, matched %d; want running, %d", outcome, matched, events)
	}
	// Kill the session that holds the request.
	var killed int
	if err := db.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
		WHERE l.locktype = 'advisory' AND l.classid = 1869570662 AND l.objid = hashtext($1)::oid AND l.granted`, req.RequestID).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminate the replay's session: %d, %v", killed, err)
	}
	// The retry, as from another process: nothing replayed again, the
	// interruption and the intent's count reported.
	retry, err := admin.NewService(admin.Config{Pool: db.Pool, Replay: replay, ReplayParallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	var out admin.ReplayOutcome
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err = retry.Replay(ctx, caller, req)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the killed backend is still going away
	}
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if !out.Repeated || out.ErrorKind != "interrupted" || out.Matched != events {
		t.Fatalf("retry: %+v; want repeated, error_kind interrupted, matched %d", out, events)
	}
	t.Logf("retry reports: matched %d, error %q", out.Matched, out.Error)
	close(release)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("the killed replay ended with %v; want an error saying its row was recorded as interrupted", err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT outcome FROM onceflow.admin_audit WHERE request_id = $1`, req.RequestID).Scan(&outcome); err != nil || outcome != "error" {
		t.Errorf("audit outcome %q, %v; want error (interrupted)", outcome, err)
	}
	total := 0
	applied.Range(func(_, _ any) bool { total++; return true })
	t.Logf("events applied by the killed replay: %d of %d; audit rows: %d", total, events, count(t, db, `SELECT count(*) FROM onceflow.admin_audit`))
}
