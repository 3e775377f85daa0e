package migrate_test

import (
	"context"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/testkit"
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
