package security

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/pgtemp"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/retention"
)

// roleSet names the five roles of deploy/sql/roles.sql plus a login member
// of each. Roles are cluster-wide, so every test uses its own names.
type roleSet struct {
	owner, writer, relay, consumer, reader string
}

func (r roleSet) all() []string {
	return []string{r.owner, r.writer, r.relay, r.consumer, r.reader}
}

// login is the name of r's login member.
func login(role string) string { return role + "_login" }

// newRoles picks unique role names. Call it before testkit.NewDB: the roles
// are dropped after the test's database is (cleanups run in reverse).
func newRoles(t *testing.T) roleSet {
	t.Helper()
	p := "sec_" + randHex(4) + "_"
	rs := roleSet{owner: p + "owner", writer: p + "writer", relay: p + "relay", consumer: p + "consumer", reader: p + "reader"}
	admin := testkit.DatabaseURL(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Logf("drop roles: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, r := range rs.all() {
			for _, name := range []string{login(r), r} {
				if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
					t.Logf("drop role %s: %v", name, err)
				}
			}
		}
	})
	return rs
}

// applyRoles runs deploy/sql/roles.sql with psql against dbURL, the way the
// docs tell operators to.
func applyRoles(t *testing.T, dbURL string, rs roleSet, consumerMayEnqueue bool) {
	t.Helper()
	psql, err := exec.LookPath("psql")
	if err != nil {
		bin, berr := pgtemp.BinDir()
		if berr != nil {
			t.Fatalf("psql not found: install the Debian package 'postgresql-client' (%v)", berr)
		}
		psql = filepath.Join(bin, "psql")
	}
	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	enq := "off"
	if consumerMayEnqueue {
		enq = "on"
	}
	cmd := exec.Command(psql, dbURL, "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-v", "owner_role="+rs.owner, "-v", "writer_role="+rs.writer,
		"-v", "relay_role="+rs.relay, "-v", "consumer_role="+rs.consumer, "-v", "reader_role="+rs.reader,
		"-v", "consumer_may_enqueue="+enq,
		"-f", filepath.Join(root, "deploy", "sql", "roles.sql"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("psql -f deploy/sql/roles.sql: %v\n%s", err, out)
	}
}

// createLogins creates a LOGIN member of each role (the server trusts
// loopback connections, so no password is needed in the test).
func createLogins(t *testing.T, db *testkit.DB, rs roleSet) {
	t.Helper()
	for _, r := range rs.all() {
		sql := fmt.Sprintf("CREATE ROLE %s LOGIN IN ROLE %s", pgx.Identifier{login(r)}.Sanitize(), pgx.Identifier{r}.Sanitize())
		if _, err := db.Pool.Exec(context.Background(), sql); err != nil {
			t.Fatalf("create login for %s: %v", r, err)
		}
	}
}

// asRole runs fn in a transaction under role r (SET LOCAL ROLE) and rolls
// it back.
func asRole(ctx context.Context, db *testkit.DB, role string, fn func(pgx.Tx) error) error {
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
		return err
	}
	return fn(tx)
}

func execAs(ctx context.Context, db *testkit.DB, role, sql string) error {
	return asRole(ctx, db, role, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sql)
		return err
	})
}

type privCase struct {
	role  string
	what  string
	sql   string
	allow bool
}

func checkPrivileges(t *testing.T, db *testkit.DB, cases []privCase) {
	t.Helper()
	ctx := context.Background()
	for _, c := range cases {
		err := execAs(ctx, db, c.role, c.sql)
		var pe *pgconn.PgError
		denied := errors.As(err, &pe) && pe.Code == "42501"
		switch {
		case c.allow && err != nil:
			t.Errorf("%s: %s: want allowed, got %v", c.role, c.what, err)
		case !c.allow && !denied:
			t.Errorf("%s: %s: want permission denied (42501), got %v", c.role, c.what, err)
		}
	}
}

const (
	// The ledger protocol: claim, then give the key back in the same statement.
	effectClaim  = `SELECT onceflow.effect_release('k-claim', '') FROM onceflow.effect_claim('k-claim')`
	handlerTable = `CREATE TABLE public.sec_handler_effects (event_id text PRIMARY KEY, n integer NOT NULL)`
	enqueueCall  = `SELECT * FROM onceflow.enqueue('orders', 'order-1', 'order.created', '{"total": 1}'::jsonb)`
	// A given event_id (its uniqueness check reads the outbox's event_id) and a generated one.
	enqueueBatchCall = `SELECT * FROM onceflow.enqueue_batch('[{"topic": "orders", "source": "order-2", "event_type": "order.created", "payload": {"total": 2}, "event_id": "batch-1"},
		{"topic": "orders", "source": "order-2", "event_type": "order.created", "payload": {}}]'::jsonb)`
	inboxInsert   = `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status) VALUES ('c', 'e1', 's', 1, 't', 'orders', 0, 0, 'processed')`
	outboxInsert  = `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('x1', 'orders', 's', 1, 't', '\x7b7d')`
	outboxPayload = `SELECT payload FROM onceflow.outbox`
	relayStatus   = `SELECT * FROM onceflow.relay_status()`
	relaySetAside = `SELECT * FROM onceflow.relay_set_aside()`
	auditInsert   = `INSERT INTO onceflow.admin_audit (request_id, consumer, action, actor, via, params, outcome) VALUES ('r1', 'c', 'dlq.replay', 'a', 'cli', '{}', 'running')`
)

// TestRolesLeastPrivilege applies deploy/sql/roles.sql to a migrated
// database and checks what each role may and may not do: the relay role
// cannot read or write the inbox (nor any consumer state), the consumer role
// cannot write the outbox, the writer role can enqueue (SQL function and Go
// API) but not read the inbox or payloads.
func TestRolesLeastPrivilege(t *testing.T) {
	t.Parallel()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, handlerTable); err != nil {
		t.Fatal(err)
	}
	applyRoles(t, db.URL, rs, false)
	// How docs/security.md says to grant a handler's own table.
	if _, err := db.Pool.Exec(ctx, "GRANT SELECT, INSERT, UPDATE, DELETE ON public.sec_handler_effects TO "+pgx.Identifier{rs.consumer}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second run (after a migration) changes nothing.
	applyRoles(t, db.URL, rs, false)

	w, r, c := rs.writer, rs.relay, rs.consumer
	checkPrivileges(t, db, []privCase{
		{w, "enqueue()", enqueueCall, true},
		{w, "enqueue_batch()", enqueueBatchCall, true},
		{w, "read the inbox", `SELECT * FROM onceflow.inbox`, false},
		{w, "write the inbox", inboxInsert, false},
		{w, "read outbox payloads", outboxPayload, false},
		{w, "mark outbox rows", `DELETE FROM onceflow.outbox_pending`, false},
		{w, "write the publish log", `INSERT INTO onceflow.outbox_published (first_id, last_id, ids) VALUES (1, 1, '{1}')`, false},
		{w, "delete outbox rows", `DELETE FROM onceflow.outbox`, false},
		{w, "read the lease", `SELECT * FROM onceflow.relay_lease`, false},
		{w, "read seq state", `SELECT * FROM onceflow.seq_state`, false},
		{w, "claim an effect", effectClaim, false},

		{r, "read unpublished rows", `SELECT o.id, o.event_id, o.topic, o.source, o.seq, o.event_type, o.content_type, o.record_key, o.headers, o.payload FROM onceflow.outbox_pending p JOIN onceflow.outbox o ON o.id = p.id ORDER BY p.id LIMIT 10`, true},
		{r, "mark rows published", `WITH m AS (DELETE FROM onceflow.outbox_pending WHERE id = ANY('{1,2}'::bigint[]) RETURNING id) INSERT INTO onceflow.outbox_published (first_id, last_id, ids) SELECT min(id), max(id), array_agg(id) FROM m HAVING count(*) > 0`, true},
		{r, "lock batches to prune", `SELECT batch, ids FROM onceflow.outbox_published WHERE published_at < now() FOR UPDATE SKIP LOCKED`, true},
		{r, "prune rows", `DELETE FROM onceflow.outbox WHERE id < 0`, true},
		{r, "prune the publish log", `DELETE FROM onceflow.outbox_published WHERE published_at < now()`, true},
		{r, "rewrite the outbox", `UPDATE onceflow.outbox SET payload = '\x00'`, false},
		{r, "take the lease", `INSERT INTO onceflow.relay_lease (shard, holder, expires_at) VALUES ('s', 'h', now()) ON CONFLICT (shard) DO UPDATE SET holder = excluded.holder, epoch = onceflow.relay_lease.epoch + 1 RETURNING epoch`, true},
		{r, "read one shard's rows", `SELECT o.id FROM onceflow.outbox_pending p JOIN onceflow.outbox o ON o.id = p.id WHERE onceflow.source_shard(o.source, 2) = 1 ORDER BY p.id LIMIT 10`, true},
		{r, "delete a settled lease", `DELETE FROM onceflow.relay_lease WHERE shard = 'x' AND shards = 2 AND expires_at <= now()`, true},
		{w, "delete the lease", `DELETE FROM onceflow.relay_lease`, false},
		{r, "bind the database identity", `UPDATE onceflow.database_identity SET first_used_at = coalesce(first_used_at, now()) RETURNING id`, true},
		{r, "read the outbox id sequence", `SELECT pg_sequence_last_value(pg_get_serial_sequence('onceflow.outbox', 'id')::regclass)`, true},
		{r, "set a row aside", `INSERT INTO onceflow.outbox_set_aside (outbox_id, event_id, topic, source, seq, event_type, reason, error) VALUES (1, 'e', 't', 's', 1, 'x', 'too_large', 'e') RETURNING outbox_id`, true},
		{r, "settle a legacy checkpoint", `UPDATE onceflow.relay_legacy_checkpoint SET settled_at = now() WHERE shard = 'x'`, true},
		{r, "read the inbox", `SELECT * FROM onceflow.inbox`, false},
		{r, "write the inbox", inboxInsert, false},
		{r, "update the inbox", `UPDATE onceflow.inbox SET status = 'dead'`, false},
		{r, "delete from the inbox", `DELETE FROM onceflow.inbox`, false},
		{r, "read seq state", `SELECT * FROM onceflow.seq_state`, false},
		{r, "read gaps", `SELECT * FROM onceflow.seq_gaps`, false},
		{r, "read effects", `SELECT * FROM onceflow.effects`, false},
		{r, "claim an effect", effectClaim, false},
		{r, "read consumer offsets", `SELECT * FROM onceflow.consumer_offsets`, false},
		{r, "create events", outboxInsert, false},
		{r, "enqueue()", enqueueCall, false},
		{r, "write a handler table", `INSERT INTO public.sec_handler_effects VALUES ('e', 1)`, false},

		{c, "write the inbox", inboxInsert, true},
		{c, "update the inbox", `UPDATE onceflow.inbox SET status = 'dead' WHERE consumer = 'c'`, true},
		{c, "store offsets", `INSERT INTO onceflow.consumer_offsets (group_id, topic, kafka_partition, next_offset) VALUES ('g', 't', 0, 1) ON CONFLICT (group_id, topic, kafka_partition) DO UPDATE SET next_offset = excluded.next_offset`, true},
		{c, "write seq state", `INSERT INTO onceflow.seq_state (consumer, source, last_applied) VALUES ('c', 's', 1)`, true},
		{c, "open a gap", `INSERT INTO onceflow.seq_gaps (consumer, source, from_seq, to_seq, opened_at, deadline) VALUES ('c', 's', 2, 3, now(), now()) RETURNING id`, true},
		{c, "record an effect", `INSERT INTO onceflow.effects (idempotency_key) VALUES ('k')`, true},
		{c, "claim an effect (effects.Do)", effectClaim, true},
		{c, "write its handler table", `INSERT INTO public.sec_handler_effects VALUES ('e', 1)`, true},
		{c, "write the outbox", outboxInsert, false},
		{c, "enqueue() (not configured)", enqueueCall, false},
		{c, "read the outbox", outboxPayload, false},
		{c, "mark outbox rows", `DELETE FROM onceflow.outbox_pending`, false},
		{c, "delete outbox rows", `DELETE FROM onceflow.outbox`, false},
		{c, "bump source counters", `INSERT INTO onceflow.source_seq VALUES ('s', 1)`, false},
		{c, "take the relay lease", `INSERT INTO onceflow.relay_lease (shard, holder, expires_at) VALUES ('s', 'h', now())`, false},
		{c, "change the database identity", `UPDATE onceflow.database_identity SET id = gen_random_uuid()`, false},
		{c, "read set-aside rows", `SELECT * FROM onceflow.outbox_set_aside`, false},
		{w, "change the database identity", `UPDATE onceflow.database_identity SET id = gen_random_uuid()`, false},
		{w, "read set-aside rows", `SELECT * FROM onceflow.outbox_set_aside`, false},

		{w, "read relay status", relayStatus, false},
		{r, "read relay status", relayStatus, true},
		{r, "read the audit", `SELECT * FROM onceflow.admin_audit`, false},
		{c, "read relay status (counts, no payloads)", relayStatus, true},
		{w, "list set-aside rows", relaySetAside, false},
		{r, "list set-aside rows", relaySetAside, true},
		{c, "list set-aside rows (no payloads)", relaySetAside, true},
		{c, "record an operator change", auditInsert, true},
		{c, "finish an operator change", `UPDATE onceflow.admin_audit SET outcome = 'ok' WHERE id = 1`, true},
		{c, "erase the audit", `DELETE FROM onceflow.admin_audit`, false},
		{c, "prune audit rows older than 90 days", `SELECT onceflow.prune_admin_audit('c', '90 days', 100)`, true},
		{c, "prune audit rows younger than 30 days", `SELECT onceflow.prune_admin_audit('c', '29 days', 100)`, false},
		{c, "prune resolved set-aside rows", `SELECT onceflow.prune_outbox_set_aside('90 days', 100)`, true},
		{c, "prune set-aside rows resolved in the last day", `SELECT onceflow.prune_outbox_set_aside('1 hour', 100)`, false},
		{w, "prune the audit", `SELECT onceflow.prune_admin_audit('c', '90 days', 100)`, false},
		{r, "prune the audit", `SELECT onceflow.prune_admin_audit('c', '90 days', 100)`, false},

		{rs.owner, "alter the schema", `ALTER TABLE onceflow.inbox ADD COLUMN x int`, true},
	})

	// The Go API (outbox.Enqueue) works under the writer role too.
	err := asRole(ctx, db, w, func(tx pgx.Tx) error {
		_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Source: "order-2", EventType: "order.created", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		t.Errorf("%s: outbox.Enqueue: %v", w, err)
	}
}

// TestRolesConsumerMayEnqueue: with consumer_may_enqueue=on the consumer
// role may enqueue (a consume-transform-produce handler does it in the
// consumer's transaction) and nothing more of the outbox.
func TestRolesConsumerMayEnqueue(t *testing.T) {
	t.Parallel()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	applyRoles(t, db.URL, rs, true)
	c := rs.consumer
	checkPrivileges(t, db, []privCase{
		{c, "enqueue()", enqueueCall, true},
		{c, "read outbox payloads", outboxPayload, false},
		{c, "mark outbox rows", `DELETE FROM onceflow.outbox_pending`, false},
		{c, "delete outbox rows", `DELETE FROM onceflow.outbox`, false},
		{c, "take the relay lease", `INSERT INTO onceflow.relay_lease (shard, holder, expires_at) VALUES ('s', 'h', now())`, false},
		{c, "write the inbox", inboxInsert, true},
	})
	// Turning it off again takes the right away.
	applyRoles(t, db.URL, rs, false)
	checkPrivileges(t, db, []privCase{{c, "enqueue() after turning it off", enqueueCall, false}})
}

// TestRolesFreshDatabase follows the documented order on an empty database:
// roles.sql (creates the schema for the owner), migrations as the owner's
// login, roles.sql again; then the writer can enqueue and the relay cannot
// read the inbox.
func TestRolesFreshDatabase(t *testing.T) {
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
	_, _, err = migrate.Up(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		t.Fatalf("migrate as %s: %v", login(rs.owner), err)
	}
	applyRoles(t, db.URL, rs, false)
	checkPrivileges(t, db, []privCase{
		{rs.writer, "enqueue()", enqueueCall, true},
		{rs.relay, "read the inbox", `SELECT * FROM onceflow.inbox`, false},
		{rs.consumer, "write the outbox", outboxInsert, false},
	})
}

// withUser returns the URL u connecting as user (no password: the test
// server trusts loopback).
func withUser(t *testing.T, u, user string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.User = url.User(user)
	return pu.String()
}

// TestRolesConsumerPrunes: the retention pruner under the consumer's role,
// which may not touch the outbox, prunes the consumer's expired inbox rows
// and leaves the published outbox rows to the relay, without an error; as
// the database owner it prunes both.
func TestRolesConsumerPrunes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	applyRoles(t, db.URL, rs, false)
	createLogins(t, db, rs)
	for _, q := range []string{inboxInsert, outboxInsert, `WITH m AS (DELETE FROM onceflow.outbox_pending RETURNING id) INSERT INTO onceflow.outbox_published (first_id, last_id, ids) SELECT min(id), max(id), array_agg(id) FROM m HAVING count(*) > 0`} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	r, err := retention.Parse([]byte(`{"classes":[{"match":"*","keep":"1h"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	o := retention.Options{Consumer: "c", Now: func() time.Time { return time.Now().Add(2 * time.Hour) }}
	pool, err := pgxpool.New(ctx, withUser(t, db.URL, login(rs.consumer)))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	st, err := retention.Prune(ctx, pool, r, o)
	if err != nil || st.Inbox != 1 || st.Outbox != 0 || !st.OutboxNotPermitted {
		t.Fatalf("prune as %s: %+v, %v; want the inbox row pruned and the outbox left to the relay", rs.consumer, st, err)
	}
	st, err = retention.Prune(ctx, db.Pool, r, o)
	if err != nil || st.Outbox != 1 || st.OutboxNotPermitted {
		t.Fatalf("prune as the owner: %+v, %v; want the published outbox row pruned", st, err)
	}
}

// TestRolesConsumerSealsBuckets: the retention pruner under the consumer's
// role seals the consumer's past time buckets and stores their filters
// (migration 037's functions run with the owner's rights), and the
// consumer's role reads the filters back; it may not write them itself.
func TestRolesConsumerSealsBuckets(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	applyRoles(t, db.URL, rs, false)
	createLogins(t, db, rs)
	pool, err := pgxpool.New(ctx, withUser(t, db.URL, login(rs.consumer)))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := retention.Parse([]byte(`{"classes":[{"match":"*","keep":"24h"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	o := retention.Options{Consumer: "c"}
	if _, err := retention.Prune(ctx, pool, r, o); err != nil { // publishes the classes
		t.Fatal(err)
	}
	var lane string
	if err := pool.QueryRow(ctx, `SELECT onceflow.inbox_lane('c', 'order.placed')`).Scan(&lane); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SELECT onceflow.inbox_ensure_buckets('c', '` + lane + `', now() - interval '12 hours')`,
		`INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at)
		 VALUES ('c', 'order-1', 's', 1, 'order.placed', 't', 0, 1, 'processed', '` + lane + `', now() - interval '12 hours')`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	st, err := retention.Prune(ctx, pool, r, o)
	if err != nil || st.BucketsSealed == 0 {
		t.Fatalf("prune as %s: %+v, %v; want the past buckets sealed", rs.consumer, st, err)
	}
	var keys int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(keys), 0) FROM onceflow.inbox_filters WHERE consumer = 'c'`).Scan(&keys); err != nil || keys != 1 {
		t.Fatalf("filters read as %s: %d ids, %v; want 1", rs.consumer, keys, err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM onceflow.inbox_filters`); err == nil {
		t.Fatalf("%s deleted filters; want permission denied", rs.consumer)
	}
}
