package itest

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestRelayLateCommitter: T1 enqueues first (smaller id) and stays open
// while T2 enqueues, commits and is published; then T1 commits. T1's event
// must still be published (R1). The test also proves the scenario is the
// one that breaks a `WHERE id > last_seen` poller: T2's larger id was
// published while T1's smaller id was invisible.
func TestRelayLateCommitter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := newRelayEnv(t, 2)
	relay := e.start("relay", nil)
	waitLeader(t, ctx, relay)

	t1, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	late, err := outbox.Enqueue(ctx, t1, outbox.Message{Topic: e.topic, Source: "late", EventType: "test.late", Payload: []byte(`{"t":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	early := e.enqueue(ctx, "early")

	var lateID, earlyID int64
	if err := t1.QueryRow(ctx, `SELECT id FROM onceflow.outbox WHERE event_id = $1`, late.EventID).Scan(&lateID); err != nil {
		t.Fatal(err)
	}
	// Wait until T2's row is published while T1 is still open.
	for {
		var published bool
		if err := e.db.Pool.QueryRow(ctx, `SELECT id, id NOT IN (SELECT id FROM onceflow.outbox_pending) FROM onceflow.outbox WHERE event_id = $1`, early.EventID).Scan(&earlyID, &published); err != nil {
			t.Fatal(err)
		}
		if published {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("T2's event was never published")
		}
		time.Sleep(10 * time.Millisecond) // polling a condition
	}
	if lateID >= earlyID {
		t.Fatalf("scenario broken: late id %d should be below early id %d", lateID, earlyID)
	}
	// A naive poller's cursor is now at earlyID and would never return lateID.
	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rep := e.check(ctx)
	if rep.Committed != 2 {
		t.Fatalf("committed %d rows, want 2", rep.Committed)
	}
}

// TestRelayRandomized: 6 writers over 24 sources, random transaction
// lengths (1-6 events, one in ten held open up to 50ms; half through
// EnqueueBatch, half one by one in random order, so deadlocks happen and
// are retried), about 20% rollbacks, at least
// 10k committed events. The read_committed checker must see every committed
// event exactly once, no rolled-back event, and every source in seq order.
// Seqs must also be gap-free per source in the table.
func TestRelayRandomized(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	e := newRelayEnv(t, 4)
	relay := e.start("relay", nil)
	waitLeader(t, ctx, relay)

	const target = 10000
	w := startWriters(ctx, writerPool(t, e.db.URL), e.topic, 6, 24, 6, 0.2, target)
	if err := w.wait(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("writers committed %d events (%d deadlock retries)", w.committed.Load(), w.retries.Load())
	if w.committed.Load() < target {
		t.Fatalf("only %d events committed", w.committed.Load())
	}
	ck := testkit.NewChecker(t, e.db.Pool, e.topic)
	rep, err := ck.Check(ctx)
	if err != nil {
		t.Fatalf("checker: %v", err)
	}
	t.Logf("checker: %s", rep)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	assertNoRolledBack(t, w, ck)
	assertGapFree(t, ctx, e)
}

// assertGapFree checks that each source's seqs on the topic are exactly
// 1..n and that id order equals seq order, in the table.
func assertGapFree(t *testing.T, ctx context.Context, e *relayEnv) {
	t.Helper()
	var bad int
	err := e.db.Pool.QueryRow(ctx, `
		SELECT count(*) FROM (
		  SELECT source, seq, row_number() OVER (PARTITION BY source ORDER BY id) AS rn
		    FROM onceflow.outbox WHERE topic = $1) s
		 WHERE seq <> rn`, e.topic).Scan(&bad)
	if err != nil {
		t.Fatal(err)
	}
	if bad != 0 {
		t.Fatalf("%d rows whose seq is not their rank in id order within the source", bad)
	}
	var maxMismatch int
	if err := e.db.Pool.QueryRow(ctx, `
		SELECT count(*) FROM onceflow.source_seq s
		  JOIN (SELECT source, topic, max(seq) m FROM onceflow.outbox GROUP BY source, topic) o USING (source, topic)
		 WHERE greatest(s.last_seq, (SELECT max(m.last_seq) FROM onceflow.source_seq_moves m WHERE m.source = s.source AND m.topic = s.topic)) <> o.m`).Scan(&maxMismatch); err != nil {
		t.Fatal(err)
	}
	if maxMismatch != 0 {
		t.Fatalf("%d sources whose counter is not their last seq (a rollback burnt a seq?)", maxMismatch)
	}
}
