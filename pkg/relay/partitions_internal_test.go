package relay

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/testkit"
)

// legacyBound is where the outbox's legacy partition ends: the first id of
// the first id-range partition (migration 034).
func legacyBound(t *testing.T, db *testkit.DB) int64 {
	t.Helper()
	var b int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT to_id FROM onceflow.outbox_partitions WHERE relname = 'outbox_legacy'`).Scan(&b); err != nil {
		t.Fatal(err)
	}
	return b
}

func sqlstate(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

const qInsertOne = `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload) VALUES ($1, 't', $2, 'e', '{}')`

// Two producers insert the same event_id; their rows' ids lie in two
// partitions, so no index of the outbox sees both: the key table
// onceflow.outbox_keys does. At every isolation level the second waits for
// the first's commit (when the first is still open) and fails with a
// unique violation on outbox_event_id_key, also when the first committed
// after the second's snapshot. Never two rows.
func TestEventIDUniqueAcrossPartitions(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	bound := legacyBound(t, db)
	cases := []struct {
		name      string
		iso       pgx.TxIsoLevel
		waits     bool   // the second inserts while the first is open
		wantFirst string // the second's error
	}{
		{"read committed, concurrent", pgx.ReadCommitted, true, "23505"},
		{"read committed, after", pgx.ReadCommitted, false, "23505"},
		{"repeatable read, concurrent", pgx.RepeatableRead, true, "23505"},
		{"repeatable read, committed after the snapshot", pgx.RepeatableRead, false, "23505"},
		{"serializable, concurrent", pgx.Serializable, true, "23505"},
		{"serializable, committed after the snapshot", pgx.Serializable, false, "23505"},
	}
	// Ranges of 10 ids from base on, one boundary per case.
	base := bound + 1000000
	for _, q := range []string{
		`SELECT setval('onceflow.outbox_id_seq', $1::bigint - 1)`, `SELECT onceflow.outbox_ensure_partitions(10)`,
		`SELECT setval('onceflow.outbox_id_seq', $1::bigint + 10 * 6)`, `SELECT onceflow.outbox_ensure_partitions()`,
	} {
		var err error
		if strings.Contains(q, "$1") {
			_, err = db.Pool.Exec(ctx, q, base)
		} else {
			_, err = db.Pool.Exec(ctx, q)
		}
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for i, c := range cases {
		eventID := "dup-" + c.name
		// The first's id is the last of a range, the second's the first
		// of the next.
		next := base + 10*int64(i+1)
		if _, err := db.Pool.Exec(ctx, `SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, next-2); err != nil {
			t.Fatal(err)
		}
		a, b := "a-"+itoa(int64(i)), "b-"+itoa(int64(i))
		first, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer first.Rollback(ctx) //nolint:errcheck
		second, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: c.iso})
		if err != nil {
			t.Fatal(err)
		}
		defer second.Rollback(ctx)                                                          //nolint:errcheck
		if _, err := second.Exec(ctx, `SELECT count(*) FROM onceflow.outbox`); err != nil { // the snapshot
			t.Fatal(err)
		}
		if _, err := first.Exec(ctx, qInsertOne, eventID, a); err != nil {
			t.Fatalf("%s: the first insert: %v", c.name, err)
		}
		done := make(chan error, 1)
		if c.waits {
			go func() {
				_, err := second.Exec(ctx, qInsertOne, eventID, b)
				done <- err
			}()
			time.Sleep(200 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("%s: the second insert did not wait for the first's commit: %v", c.name, err)
			default:
			}
			if err := first.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			if err := first.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			_, err := second.Exec(ctx, qInsertOne, eventID, b)
			done <- err
		}
		err = <-done
		if err == nil { // the property broke: let the duplicate commit, for the count below
			err = second.Commit(ctx)
		}
		_ = second.Rollback(ctx)
		if got := sqlstate(err); got != c.wantFirst {
			t.Errorf("%s: the second insert: %v (SQLSTATE %q), want SQLSTATE %s", c.name, err, got, c.wantFirst)
		}
		// Run again: a unique violation again.
		err = pgx.BeginTxFunc(ctx, db.Pool, pgx.TxOptions{IsoLevel: c.iso}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, qInsertOne, eventID, b)
			return err
		})
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "23505" || pe.ConstraintName != "outbox_event_id_key" {
			t.Errorf("%s: the retry: %v, want a unique violation of outbox_event_id_key", c.name, err)
		}
		var n int
		var where string
		if err := db.Pool.QueryRow(ctx, `SELECT count(*), string_agg(tableoid::regclass::text, ',') FROM onceflow.outbox WHERE event_id = $1`, eventID).Scan(&n, &where); err != nil {
			t.Fatal(err)
		}
		if want := "onceflow.outbox_p_" + itoa(next-10); n != 1 || where != want {
			t.Errorf("%s: %d rows of the event_id, in %s; want one, in %s", c.name, n, where, want)
		}
	}
	// The other way round: a row of a range refuses the same event_id in
	// the legacy partition, under the same constraint name.
	if _, err := db.Pool.Exec(ctx, `SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, base+100); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, qInsertOne, "late", "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound-100); err != nil {
		t.Fatal(err)
	}
	_, err := db.Pool.Exec(ctx, qInsertOne, "late", "d")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" || pe.ConstraintName != "outbox_event_id_key" {
		t.Errorf("the same event_id in the legacy partition: %v, want a unique violation of outbox_event_id_key", err)
	}
	// Every row has its key, and no key is left without its row.
	var rows, keys, stray int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM onceflow.outbox), (SELECT count(*) FROM onceflow.outbox_keys),
		(SELECT count(*) FROM onceflow.outbox_keys k WHERE NOT EXISTS (SELECT 1 FROM onceflow.outbox o WHERE o.id = k.id AND o.event_id COLLATE "C" = k.event_id))`).Scan(&rows, &keys, &stray); err != nil {
		t.Fatal(err)
	}
	if rows != keys || stray != 0 {
		t.Errorf("%d rows, %d keys, %d keys without their row", rows, keys, stray)
	}
}

// Retention empties and drops a partition whose rows are all published
// and older than the retention, with its publish-log rows; it keeps a
// partition with a pending row, and one with an unresolved set-aside row,
// until they are published or resolved; a partition whose ids are not all
// drawn stays.
func TestRetentionDropsPublishedPartitions(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	bound := legacyBound(t, db)
	h := quietHousekeeper(t, Config{DB: db.Pool, Retention: time.Hour})
	st := dbT{t, db.Pool}
	exec, one, insert := st.exec, st.one, st.insert
	publish := func(ids []int64) {
		t.Helper()
		exec(qMarkPublished, ids)
	}
	parts := func() string {
		t.Helper()
		var s string
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(c.relname, ',' ORDER BY c.relname), '') FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'onceflow.outbox'::regclass`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	run := func() {
		t.Helper()
		if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
			t.Fatal(err)
		}
	}

	// Ranges of 100 ids from bound + 1,000,000 on: A, B, C, D.
	w := int64(1000000)
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w-3)
	exec(`SELECT onceflow.outbox_ensure_partitions(100)`)
	pA := insert(2, "a") // the first range's last two ids, then A's
	pA = append(pA, insert(10, "a")...)
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w+100)
	exec(`SELECT onceflow.outbox_ensure_partitions()`)
	pB := insert(10, "b")
	pendingB := insert(1, "b")
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w+200)
	exec(`SELECT onceflow.outbox_ensure_partitions()`)
	pC := insert(10, "c")
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w+300)
	exec(`SELECT onceflow.outbox_ensure_partitions()`)
	pD := insert(5, "d") // D's ids are not all drawn
	publish(pA[:6])
	publish(pA[6:])
	publish(pB)
	publish(pC)
	publish(pD)
	// C's one row was set aside and is not resolved.
	exec(`INSERT INTO onceflow.outbox_set_aside (outbox_id, event_id, topic, source, seq, event_type, reason, error)
		SELECT id, event_id, topic, source, seq, event_type, 'test', 'test' FROM onceflow.outbox WHERE id = $1`, pC[3])
	exec(`UPDATE onceflow.outbox_published SET published_at = now() - interval '2 hours'`)

	nameA, nameB, nameC, nameD := "outbox_p_"+itoa(bound+w), "outbox_p_"+itoa(bound+w+100), "outbox_p_"+itoa(bound+w+200), "outbox_p_"+itoa(bound+w+300)
	var evA string
	if err := db.Pool.QueryRow(ctx, `SELECT event_id FROM onceflow.outbox WHERE id = $1`, pA[len(pA)-1]).Scan(&evA); err != nil {
		t.Fatal(err)
	}
	before := parts()
	for _, n := range []string{"outbox_legacy", "outbox_p_" + itoa(bound), nameA, nameB, nameC, nameD} {
		if !contains(before, n) {
			t.Fatalf("partitions %s: no %s", before, n)
		}
	}
	run()
	after := parts()
	// The legacy partition (empty, its ids all drawn) and the first range
	// (two rows, published) go too.
	for _, gone := range []string{"outbox_legacy", "outbox_p_" + itoa(bound), nameA} {
		if contains(after, gone) {
			t.Errorf("partition %s kept: %s", gone, after)
		}
	}
	for _, kept := range []string{nameB, nameC, nameD, "outbox_default"} {
		if !contains(after, kept) {
			t.Errorf("partition %s dropped: %s", kept, after)
		}
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox WHERE source IN ('b', 'c', 'd')`); n != 26 {
		t.Errorf("%d rows of B, C and D left, want 26", n)
	}
	// The keys of the emptied ranges went with them: their event_ids are
	// free again; the kept rows' keys stay.
	if n := one(`SELECT count(*) FROM onceflow.outbox_keys WHERE id < $1`, bound+w+100); n != 0 {
		t.Errorf("%d keys of the emptied ranges left", n)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_keys k JOIN onceflow.outbox o ON o.id = k.id AND o.event_id COLLATE "C" = k.event_id WHERE o.source IN ('b', 'c', 'd')`); n != 26 {
		t.Errorf("%d keys of B, C and D's rows, want 26", n)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_published WHERE last_id < $1`, bound+w+100); n != 0 {
		t.Errorf("%d publish-log rows of the dropped ranges left", n)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_published`); n != 3 {
		t.Errorf("%d publish-log rows left, want B's, C's and D's", n)
	}

	// Published and resolved: B and C go at the next pass.
	publish(pendingB)
	exec(`UPDATE onceflow.outbox_published SET published_at = now() - interval '2 hours'`)
	exec(`UPDATE onceflow.outbox_set_aside SET resolved_at = now(), resolution = 'skipped'`)
	// The newest published batch is kept (recovery reads its last id).
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound+w+400)
	run()
	after = parts()
	for _, gone := range []string{nameB, nameC, nameD} {
		if contains(after, gone) {
			t.Errorf("partition %s kept after publishing: %s", gone, after)
		}
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_published`); n != 1 {
		t.Errorf("%d publish-log rows left, want the newest batch", n)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_partitions WHERE from_id > $1 AND relname LIKE 'outbox\_p\_%'`, bound+w+300); n < 1 {
		t.Errorf("no partition ahead of the ids")
	}
	// Inserts go on.
	insert(3, "e")
	// An event_id of an emptied range may be enqueued again.
	exec(qInsertOne, evA, "again")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func contains(list, name string) bool { return slices.Contains(strings.Split(list, ","), name) }

// With -delete-on-publish the rows leave at publish and nothing is logged:
// a range whose ids are all drawn and none queued is dropped at once.
func TestDeleteOnPublishDropsEmptiedPartitions(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	bound := legacyBound(t, db)
	h := quietHousekeeper(t, Config{DB: db.Pool, Retention: time.Hour, DeleteOnPublish: true})
	if _, err := db.Pool.Exec(ctx, `SELECT setval('onceflow.outbox_id_seq', $1::bigint - 1)`, bound+1000000); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.outbox_ensure_partitions(10)`); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload)
		SELECT 'e' || g, 't', 's', 'e', '{}' FROM generate_series(1, 15) g RETURNING id`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	first := "outbox_p_" + itoa(bound+1000000)
	has := func() bool {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = $1 AND relnamespace = 'onceflow'::regnamespace`, first).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
		t.Fatal(err)
	}
	if !has() {
		t.Fatalf("%s dropped while its rows are queued", first)
	}
	if _, err := db.Pool.Exec(ctx, qDeletePublished, ids); err != nil {
		t.Fatal(err)
	}
	if err := h.partitions(ctx, h.cfg.Retention.Seconds()); err != nil {
		t.Fatal(err)
	}
	if has() {
		t.Fatalf("%s kept after its rows were published and deleted", first)
	}
}

// Producers at every isolation level insert the same event_ids at the same
// time (each takes its snapshot, waits a little, then inserts), running
// each transaction again on a serialization failure or a deadlock, while
// their ids run through ranges of ten ids: every event_id ends up in one
// row, and every insert that committed is a row.
func TestEventIDUniqueUnderConcurrentProducers(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	base := legacyBound(t, db) + 1000000
	for k := range 60 {
		if _, err := db.Pool.Exec(ctx, `SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, base+10*int64(k)-1); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `SELECT onceflow.outbox_ensure_partitions(10)`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Pool.Exec(ctx, `SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, base-1); err != nil {
		t.Fatal(err)
	}
	levels := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}
	const workers, each = 6, 40
	committed := make([]int, workers)
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range each {
				eventID := "k-" + itoa(int64(i))
				iso := levels[(w+i)%len(levels)]
				for try := 0; ; try++ {
					err := pgx.BeginTxFunc(ctx, db.Pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, `SELECT count(*) FROM onceflow.outbox`); err != nil { // an early snapshot
							return err
						}
						if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.003)`); err != nil {
							return err
						}
						_, err := tx.Exec(ctx, qInsertOne, eventID, "w"+itoa(int64(w)))
						return err
					})
					code := sqlstate(err)
					if err == nil {
						committed[w]++
					} else if (code == "40001" || code == "40P01") && try < 20 {
						continue
					} else if code != "23505" {
						errs <- err
						return
					}
					break
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	total := 0
	for _, n := range committed {
		total += n
	}
	var rows, keys, places int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id), count(DISTINCT tableoid) FROM onceflow.outbox WHERE event_id LIKE 'k-%'`).Scan(&rows, &keys, &places); err != nil {
		t.Fatal(err)
	}
	if rows != keys || rows != total || keys != each {
		t.Fatalf("%d rows of %d event_ids, %d inserts committed: want one row per event_id, one per commit", rows, keys, total)
	}
	t.Logf("%d event_ids in %d partitions", keys, places)
}
