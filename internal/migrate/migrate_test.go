package migrate_test

import (
	"context"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/migrations"
)

func TestLoadRejectsHolesAndMissingUp(t *testing.T) {
	t.Parallel()
	cases := map[string]fstest.MapFS{
		"hole": {
			"001_a.up.sql": {Data: []byte("SELECT 1")},
			"003_c.up.sql": {Data: []byte("SELECT 1")},
		},
		"no up": {
			"001_a.down.sql": {Data: []byte("SELECT 1")},
		},
		"two names": {
			"001_a.up.sql":   {Data: []byte("SELECT 1")},
			"001_b.down.sql": {Data: []byte("SELECT 1")},
		},
	}
	for name, fsys := range cases {
		if _, err := migrate.Load(fsys); err == nil {
			t.Errorf("%s: Load accepted it", name)
		}
	}
}

// Two migrators racing on an empty database: the advisory lock makes one wait
// for the other; both end at the latest version and the schema is applied once.
func TestUpConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	latest, err := migrate.Latest()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	tos := make([]int32, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, db.URL)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(ctx)
			_, tos[i], errs[i] = migrate.Up(ctx, conn)
		}()
	}
	wg.Wait()
	for i := range 3 {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		if tos[i] != latest {
			t.Fatalf("migrator %d ended at %d, want %d", i, tos[i], latest)
		}
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	from, to, err := migrate.Up(ctx, conn)
	if err != nil || from != latest || to != latest {
		t.Fatalf("second Up: from %d to %d err %v", from, to, err)
	}
	// Down to zero and up again: the down files undo the up files.
	if _, to, err := migrate.To(ctx, conn, 0); err != nil || to != 0 {
		t.Fatalf("down to 0: to %d err %v", to, err)
	}
	var tables int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'onceflow' AND tablename <> 'schema_version'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d tables left after migrating down to 0", tables)
	}
	if _, to, err := migrate.Up(ctx, conn); err != nil || to != latest {
		t.Fatalf("up again: to %d err %v", to, err)
	}
}

// Down one step at a time from the newest version, then up again: every
// down file undoes its own up file only. Undoing the SQL fencing functions
// (effects_protocol) leaves the ledger's scope column and key of the
// migration before it in place.
func TestDownStepByStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.EmptyDB(t)
	migs, err := migrate.Load(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	one := func(q string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	const (
		qFuncs = `SELECT count(*) FROM pg_proc WHERE pronamespace = 'onceflow'::regnamespace AND proname LIKE 'effect\_%'`
		qScope = `SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass('onceflow.effects') AND attname = 'scope' AND NOT attisdropped`
		qKey   = `SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass('onceflow.effects') AND contype = 'p' AND array_length(conkey, 1) = 2`
	)
	if _, _, err := migrate.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	body := func() string {
		t.Helper()
		var src string
		if err := conn.QueryRow(ctx, `SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = 'onceflow' AND p.proname = 'enqueue_batch'`).Scan(&src); err != nil {
			t.Fatalf("enqueue_batch: %v", err)
		}
		return src
	}
	sawProtocol := false
	var fastDown string // enqueue_batch's body after the down of enqueue_batch_fast
	for i := len(migs) - 1; i >= 0; i-- {
		m := migs[i]
		if _, to, err := migrate.To(ctx, conn, int32(m.Version-1)); err != nil || to != int32(m.Version-1) {
			t.Fatalf("down from %d (%s): to %d, %v", m.Version, m.Name, to, err)
		}
		if m.Name == "enqueue_batch_fast" {
			fastDown = body()
		}
		if m.Name == "effects_protocol" {
			sawProtocol = true
			if n := one(qFuncs); n != 0 {
				t.Errorf("down of %d_%s left %d effect_ functions", m.Version, m.Name, n)
			}
			if one(qScope) != 1 || one(qKey) != 1 {
				t.Errorf("down of %d_%s dropped the ledger's scope column or (scope, idempotency_key) key", m.Version, m.Name)
			}
		}
	}
	if !sawProtocol {
		t.Fatal("no effects_protocol migration")
	}
	if n := one(`SELECT count(*) FROM pg_proc WHERE pronamespace = 'onceflow'::regnamespace`) +
		one(`SELECT count(*) FROM pg_type t WHERE t.typnamespace = 'onceflow'::regnamespace AND t.typtype IN ('c', 'e', 'd')
		      AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')`); n != 0 {
		t.Errorf("%d functions or types left in schema onceflow at version 0", n)
	}
	// The down of enqueue_batch_fast puts back the body that enqueue_batch
	// (migration 010) creates.
	if fastDown == "" {
		t.Fatal("no enqueue_batch_fast migration")
	}
	for _, m := range migs {
		if m.Name != "enqueue_batch" {
			continue
		}
		if _, to, err := migrate.To(ctx, conn, int32(m.Version)); err != nil || to != int32(m.Version) {
			t.Fatalf("up to %d: to %d, %v", m.Version, to, err)
		}
		if body() != fastDown {
			t.Error("the down of enqueue_batch_fast did not restore enqueue_batch's body of migration enqueue_batch")
		}
	}
	if _, to, err := migrate.Up(ctx, conn); err != nil || to != int32(len(migs)) {
		t.Fatalf("up again: to %d, %v", to, err)
	}
	if one(qFuncs) == 0 || one(qScope) != 1 {
		t.Fatal("up again: the fencing functions or the scope column are missing")
	}
}
