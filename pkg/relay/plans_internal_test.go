package relay

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
)

// planNode is the part of EXPLAIN (FORMAT JSON) the plan tests read.
type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Parent   string     `json:"Parent Relationship"`
	Hit      int64      `json:"Shared Hit Blocks"`
	Read     int64      `json:"Shared Read Blocks"`
	Plans    []planNode `json:"Plans"`
}

// walk calls f for n and every node below it.
func (n planNode) walk(f func(planNode)) {
	f(n)
	for _, c := range n.Plans {
		c.walk(f)
	}
}

// explain runs EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of sql in a
// transaction begun with begin (the reader's planner settings, or none).
func explain(t *testing.T, db *testkit.DB, begin, sql string, args ...any) planNode {
	t.Helper()
	ctx := context.Background()
	var out []byte
	tx, err := db.Pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // what the statement wrote (a sweep queues rows) is undone
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&out); err != nil {
		t.Fatal(err)
	}
	var p []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(out, &p); err != nil || len(p) != 1 {
		t.Fatalf("EXPLAIN output %s: %v", out, err)
	}
	return p[0].Plan
}

// queueReads counts the plan's nodes that read onceflow.outbox_pending,
// by type, and those that read it as a join's input rather than as a
// subplan's probe (the insert into it aside).
func queueReads(p planNode) (scans map[string]int, joined int) {
	scans = map[string]int{}
	p.walk(func(n planNode) {
		if n.Relation == "outbox_pending" {
			scans[n.Type]++
			if n.Type != "ModifyTable" && n.Parent != "SubPlan" {
				joined++
			}
		}
	})
	return scans, joined
}

// TestQueuePlansIgnoreStaleStatistics: the poll and the sweeps keep to
// walks and probes of the queue's key when its statistics are stale. 5,000
// rows are published and both tables analyzed, then 100,000 rows are
// committed unanalyzed, as one large transaction does between two of
// autovacuum's ANALYZEs. The poll must walk the key from the floor (a few
// blocks per row it returns); each sweep must probe the queue once per
// outbox row of its range, never read it as a join's input: planned by the
// stale statistics, the old sweep merged the queue from its first key
// (reading up to the range: the further the full walk, the more it read;
// 3.6 s per sweep at 1M rows) or, in the growth benchmark, joined it by a
// nested loop that read all of it per outbox row (one sweep ran 84 s). The
// settings must reach the idle poll's batch and end with it.
func TestQueuePlansIgnoreStaleStatistics(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	fill := func(from, to int) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `
			INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, payload)
			SELECT 'ev-' || g, 't', 'src-' || (g % 256), g / 256 + 1, 'e', 'application/octet-stream', '\x00'
			  FROM generate_series($1::int, $2::int - 1) g`, from, to); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{
		`ALTER TABLE onceflow.outbox_pending SET (autovacuum_enabled = false)`,
	} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	fill(0, 5000)
	// Published as the relay marks them: out of the queue, into the
	// publish log in batches of 1,000.
	for _, s := range []string{`
		WITH d AS (DELETE FROM onceflow.outbox_pending RETURNING id)
		INSERT INTO onceflow.outbox_published (first_id, last_id, ids)
		SELECT min(id), max(id), array_agg(id ORDER BY id) FROM d GROUP BY id / 1000`,
		`ANALYZE onceflow.outbox_pending`, `ANALYZE onceflow.outbox`} {
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	const queued = 100_000
	fill(5000, 5000+queued)

	cfg := Config{DB: db.Pool, BatchMaxRows: 1000, BatchMaxBytes: 4 << 20}
	rd := testReader(t, cfg)
	q, args := rd.poll(nil)

	walked := explain(t, db, qBeginWalk, q, args...)
	scans, _ := queueReads(walked)
	blocks := walked.Hit + walked.Read
	t.Logf("poll: queue read by %v, %d blocks", scans, blocks)
	if scans["Seq Scan"]+scans["Bitmap Heap Scan"] > 0 || blocks > 10*int64(cfg.BatchMaxRows) {
		t.Errorf("the poll read the queue by %v (%d blocks for %d rows): not a walk of its key", scans, blocks, cfg.BatchMaxRows)
	}

	// The idle poll's batch gets the same settings.
	rows, err := rd.fetchAlone(ctx, nil)
	if err != nil || len(rows) != cfg.BatchMaxRows {
		t.Fatalf("fetchAlone: %d rows, %v", len(rows), err)
	}
	var seqscan string
	b := &pgx.Batch{}
	b.Queue(qIndexPlans)
	b.Queue(`SELECT current_setting('enable_seqscan') || current_setting('enable_bitmapscan') || current_setting('jit')`).QueryRow(func(r pgx.Row) error { return r.Scan(&seqscan) })
	if err := db.Pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	if seqscan != "offoffoff" {
		t.Errorf("the statement after qIndexPlans in one batch ran with enable_seqscan, enable_bitmapscan, jit = %s, want offoffoff", seqscan)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT current_setting('enable_seqscan') || current_setting('enable_bitmapscan')`).Scan(&seqscan); err != nil {
		t.Fatal(err)
	}
	if seqscan != "onon" {
		t.Errorf("after the batch the connection kept enable_seqscan, enable_bitmapscan = %s, want onon", seqscan)
	}

	var iso string
	if err := pgx.BeginTxFunc(ctx, db.Pool, pgx.TxOptions{BeginQuery: qBeginWalk}, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT current_setting('transaction_isolation') || ', ' || current_setting('enable_seqscan')`).Scan(&iso)
	}); err != nil {
		t.Fatal(err)
	}
	if iso != "repeatable read, off" {
		t.Errorf("a transaction begun by qBeginWalk runs at %q, want \"repeatable read, off\"", iso)
	}

	// The tail sweep (the newest 1,000 ids), a full-walk chunk of published
	// rows and one in the middle of the queued rows.
	for _, r := range []struct {
		name   string
		lo, hi int64
		ids    int64
	}{
		{"tail", 5000 + queued - sweepMargin, math.MaxInt64 - 1, sweepMargin},
		{"full, published", 0, sweepChunk, sweepChunk},
		{"full, queued", 5000 + queued/2, 5000 + queued/2 + sweepChunk, sweepChunk},
	} {
		sweep, args := rd.lay.sharded(qSweep, qSweepShard, r.lo, r.hi)
		p := explain(t, db, qBeginWalk, sweep, args...)
		scans, joined := queueReads(p)
		blocks := p.Hit + p.Read
		t.Logf("%s sweep: queue read by %v, %d blocks", r.name, scans, blocks)
		if joined > 0 || scans["Seq Scan"]+scans["Bitmap Heap Scan"] > 0 || blocks > 10*r.ids {
			t.Errorf("%s sweep: the queue read by %v (%d of them as a join's input), %d blocks for %d ids: not probed per row",
				r.name, scans, joined, blocks, r.ids)
		}
	}
}

// TestPublishLogPlansSkipPartitions: the statements that read the
// partitioned publish log (migration 035) read only the partitions they
// need, by index. The sweep of a range of ids above the legacy bound
// reads none of the log's legacy partition (its bound last_id > $1 prunes
// it), and the highest last_id (qOutboxLastID, the prune's and the
// restore check's reference) is the top of each partition's index on
// last_id, never a scan of a partition's rows.
func TestPublishLogPlansSkipPartitions(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	bound := legacyBound(t, db)
	fill := func(n int) {
		t.Helper()
		for _, q := range []string{`
			INSERT INTO onceflow.outbox (event_id, topic, source, event_type, content_type, payload)
			SELECT gen_random_uuid()::text, 't', 'src-' || (g % 16), 'e', 'application/octet-stream', '\x00'
			  FROM generate_series(1, $1::int) g`, `
			WITH d AS (DELETE FROM onceflow.outbox_pending RETURNING id)
			INSERT INTO onceflow.outbox_published (first_id, last_id, ids)
			SELECT min(id), max(id), array_agg(id ORDER BY id) FROM d GROUP BY id / 10`} {
			var err error
			if strings.Contains(q, "$1") {
				_, err = db.Pool.Exec(ctx, q, n)
			} else {
				_, err = db.Pool.Exec(ctx, q)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	fill(5000) // in the legacy partitions
	if _, err := db.Pool.Exec(ctx, `SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound); err != nil {
		t.Fatal(err)
	}
	fill(5000) // in the first range's
	for _, q := range []string{`ANALYZE onceflow.outbox_published`, `ANALYZE onceflow.outbox`} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	reads := func(p planNode) map[string]string {
		m := map[string]string{}
		p.walk(func(n planNode) {
			if strings.HasPrefix(n.Relation, "outbox_published") {
				m[n.Relation] += n.Type + ";"
			}
		})
		return m
	}

	rd := testReader(t, Config{DB: db.Pool, BatchMaxRows: 1000, BatchMaxBytes: 4 << 20})
	sweep, args := rd.lay.sharded(qSweep, qSweepShard, bound+2000, bound+2000+sweepChunk)
	got := reads(explain(t, db, qBeginWalk, sweep, args...))
	t.Logf("sweep above the bound reads the log by %v", got)
	if _, ok := got["outbox_published_legacy"]; ok || got["outbox_published_p_"+itoa(bound)] == "" {
		t.Errorf("the sweep of ids above the legacy bound reads the log's partitions %v: want the first range's, not the legacy one", got)
	}

	got = reads(explain(t, db, "", `SELECT max(last_id) FROM onceflow.outbox_published`))
	t.Logf("the highest last_id read by %v", got)
	for rel, how := range got {
		if strings.Contains(how, "Seq Scan") || strings.Contains(how, "Bitmap") {
			t.Errorf("the highest last_id reads %s by %s: not the top of its index", rel, how)
		}
	}
	if len(got) == 0 {
		t.Error("the highest last_id reads no partition of the log")
	}
}
