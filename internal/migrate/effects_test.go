package migrate_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/migrate"
)

// The effect partitions migration keeps the ledger's rows and protocol:
// the rows of the plain table become the legacy partition, readable and
// claimable as before (a done key replays, a running lease is busy), while
// claims run on other connections during the migration; new keys land in
// the default partition, or in a bucket once one is made. The way down
// gives back a plain table with every row and the functions as they were.
func TestEffectPartitionsMigrationCarriesRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newMigrationFixture(t, "effect_partitions")
	db, parts, conn, exec, text := f.db, f.version, f.conn, f.exec, f.text
	const (
		scope   = "inbox/c1/http/pay"
		qRows   = `SELECT coalesce(string_agg(concat_ws('|', scope, idempotency_key, event_id, status, attempts, result_code, result::text, claimed_by, held_reason), E'\n' ORDER BY scope, idempotency_key), '') FROM onceflow.effects`
		qFuncs  = `SELECT string_agg(p.oid::regprocedure::text || ' ' || md5(p.prosrc) || ' ' || coalesce(p.proconfig::text, ''), E'\n' ORDER BY p.oid::regprocedure::text) FROM pg_proc p WHERE p.pronamespace = 'onceflow'::regnamespace`
		qKind   = `SELECT relkind::text FROM pg_class WHERE oid = 'onceflow.effects'::regclass`
		qPlaces = `SELECT string_agg(DISTINCT tableoid::regclass::text, ',') FROM onceflow.effects`
	)
	if _, _, err := migrate.To(ctx, conn, parts-1); err != nil {
		t.Fatal(err)
	}
	exec(`SELECT onceflow.effect_claim('done-1', $1, 'e1')`, scope)
	exec(`SELECT onceflow.effect_record('done-1', $1, 200, '{"ok": 1}')`, scope)
	exec(`SELECT onceflow.effect_lease_claim('leased', '', 'e2', 'a', interval '1 hour')`)
	exec(`SELECT onceflow.effect_lease_claim('held', $1, 'e3', 'a', interval '1 hour')`, scope)
	exec(`SELECT onceflow.effect_hold('held', $1, 'past the window')`, scope)
	exec(`SELECT onceflow.effect_lease_record('bulk-' || g, $1, 201, NULL, 'eb' || g) FROM generate_series(1, 200) g`, scope)
	rowsBefore, funcsBefore := text(qRows), text(qFuncs)

	// Claims of new and old keys on other connections while it migrates.
	stop := make(chan struct{})
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		claimErr []error
		claimed  int
	)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var st string
				err := db.Pool.QueryRow(ctx, `SELECT status FROM onceflow.effect_lease_claim($1, $2, NULL, 'w', interval '1 hour')`,
					fmt.Sprintf("during-%d-%d", w, i%50), scope).Scan(&st)
				if err == nil {
					err = db.Pool.QueryRow(ctx, `SELECT status FROM onceflow.effect_lease_claim('done-1', $1, NULL, 'w', interval '1 hour')`, scope).Scan(&st)
					// busy: the other worker's claim of it is under way.
					if err == nil && st != "done" && st != "busy" {
						err = fmt.Errorf("done-1 answered %s", st)
					}
				}
				mu.Lock()
				if err != nil {
					claimErr = append(claimErr, err)
				} else {
					claimed++
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	if _, _, err := migrate.To(ctx, conn, parts); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // a few claims after the migration too
	close(stop)
	wg.Wait()
	if len(claimErr) > 0 || claimed == 0 {
		t.Fatalf("claims during the migration: %d ok, errors %v", claimed, claimErr)
	}
	if got := text(qKind); got != "p" {
		t.Fatalf("onceflow.effects relkind %s after the migration, want p", got)
	}
	if n := text(`SELECT count(*)::text FROM (SELECT 1 FROM onceflow.effects GROUP BY scope, idempotency_key HAVING count(*) > 1) d`); n != "0" {
		t.Errorf("%s keys with two rows", n)
	}
	during := text(`SELECT count(*)::text FROM onceflow.effects WHERE idempotency_key LIKE 'during-%'`)
	exec(`DELETE FROM onceflow.effects WHERE idempotency_key LIKE 'during-%'`)
	if got := text(qRows); got != rowsBefore {
		t.Errorf("rows after the migration:\n%s\nwant\n%s", got, rowsBefore)
	}
	if got := text(qPlaces); got != "onceflow.effects_legacy" {
		t.Errorf("rows lie in %s, want all in the legacy partition", got)
	}
	// The old rows answer as before. New keys land in the default
	// partition until the consumer's bucket exists; a bucket whose range
	// the default partition has rows of is not made, the next one is.
	if got := text(`SELECT concat_ws(' ', status, result_code, result::text) FROM onceflow.effect_claim('done-1', $1)`, scope); got != `done 200 {"ok": 1}` {
		t.Errorf("claim of done-1: %s", got)
	}
	if got := text(`SELECT status FROM onceflow.effect_lease_claim('leased', '', 'e2', 'b', interval '1 minute')`); got != "busy" {
		t.Errorf("claim of the running lease by another owner: %s, want busy", got)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.effect_lease_claim('held', $1, 'e3', 'b', interval '1 minute')`, scope); err == nil {
		t.Error("claim of the held key succeeded")
	}
	exec(`SELECT onceflow.effect_lease_claim('new-1', $1, 'e4', 'a', interval '1 minute')`, scope)
	exec(`SELECT onceflow.effects_ensure_buckets('inbox/c1/', 86400)`)
	if got := text(`SELECT count(*)::text FROM onceflow.effects_buckets WHERE owner = 'inbox/c1/' AND from_at > now()`); got != "1" {
		t.Errorf("%s next buckets of c1, want 1 (its current range has rows in the default partition)", got)
	}
	exec(`SELECT onceflow.effects_ensure_buckets('inbox/c2/', 86400)`)
	exec(`SELECT onceflow.effect_lease_claim('new-2', 'inbox/c2/http/pay', 'e5', 'a', interval '1 minute')`)
	if got := text(`SELECT string_agg(left(tableoid::regclass::text, 19), ',' ORDER BY idempotency_key) FROM onceflow.effects WHERE idempotency_key LIKE 'new-%'`); got != "onceflow.effects_de,onceflow.effects_b_" {
		t.Errorf("new keys in %s, want the default partition, then a bucket", got)
	}

	// Down: one plain table with every row, the functions as they were.
	if _, _, err := migrate.To(ctx, conn, parts-1); err != nil {
		t.Fatal(err)
	}
	if got := text(qKind); got != "r" {
		t.Fatalf("onceflow.effects relkind %s after the way down, want r", got)
	}
	if got := text(`SELECT count(*)::text FROM onceflow.effects WHERE idempotency_key LIKE 'new-%'`); got != "2" {
		t.Errorf("%s new rows after the way down, want 2", got)
	}
	exec(`DELETE FROM onceflow.effects WHERE idempotency_key LIKE 'new-%'`)
	if got := text(qRows); got != rowsBefore {
		t.Errorf("rows after the way down:\n%s\nwant\n%s", got, rowsBefore)
	}
	if got := text(qFuncs); got != funcsBefore {
		t.Errorf("functions after the way down differ from before the migration:\n%s\nwant\n%s", got, funcsBefore)
	}
	exec(`SELECT onceflow.effect_lease_claim('after-down', $1, NULL, 'a', interval '1 minute')`, scope)
	if _, _, err := migrate.Up(ctx, conn); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d claims ran during the migration (%s new keys)", claimed, during)
}
