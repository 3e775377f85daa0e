package itest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestRelayLateCommitUnderScanFloor: the relay's scan floor (docs/relay.md,
// "How the poll stays cheap under old snapshots") does not rise past a row
// whose transaction is still open. With a read-only REPEATABLE READ snapshot
// held throughout (which must not stop the floor), two writers take low ids
// and stay open, one through Enqueue (two rows of source "late-one"), one
// through EnqueueBatch (source "late-batch"); 3,000 rows with higher ids
// are published meanwhile, and a few more after them, each poll raising the
// floor as far as it may. Then both writers commit, and each late source
// writes one more row. Every row must be published exactly once, each
// source in seq order (R1, R2).
func TestRelayLateCommitUnderScanFloor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := newRelayEnv(t, 2)

	snap, err := e.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := snap.Exec(ctx, `SELECT count(*) FROM onceflow.outbox`); err != nil {
		t.Fatal(err)
	}

	relay := e.start("relay", nil, "-batch-max-rows", "200")
	waitLeader(t, ctx, relay)

	msg := func(source string) outbox.Message {
		return outbox.Message{Topic: e.topic, Source: source, EventType: "test.late", Payload: []byte(`{}`)}
	}
	t1, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	for range 2 {
		if _, err := outbox.Enqueue(ctx, t1, msg("late-one")); err != nil {
			t.Fatal(err)
		}
	}
	t2, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	if _, err := outbox.EnqueueBatch(ctx, t2, []outbox.Message{msg("late-batch"), msg("late-batch")}); err != nil {
		t.Fatal(err)
	}
	var lateID int64
	if err := t1.QueryRow(ctx, `SELECT max(id) FROM onceflow.outbox WHERE source = 'late-one'`).Scan(&lateID); err != nil {
		t.Fatal(err)
	}

	for b := range 6 {
		msgs := make([]outbox.Message, 500)
		for i := range msgs {
			msgs[i] = msg(fmt.Sprintf("src-%d", (b*500+i)%32))
		}
		if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.EnqueueBatch(ctx, tx, msgs)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Each of these is published by a poll after the 3,000, and each such
	// poll tries to raise the floor.
	waitPublished := func(eventID string) {
		t.Helper()
		for {
			var published bool
			if err := e.db.Pool.QueryRow(ctx, `SELECT id NOT IN (SELECT id FROM onceflow.outbox_pending) FROM onceflow.outbox WHERE event_id = $1`,
				eventID).Scan(&published); err != nil {
				t.Fatal(err)
			}
			if published {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("event %s was never published", eventID)
			}
			time.Sleep(10 * time.Millisecond) // polling a condition
		}
	}
	var lastID int64
	for range 3 {
		res := e.enqueue(ctx, "after")
		waitPublished(res.EventID)
		if err := e.db.Pool.QueryRow(ctx, `SELECT id FROM onceflow.outbox WHERE event_id = $1`, res.EventID).Scan(&lastID); err != nil {
			t.Fatal(err)
		}
	}
	if lateID >= lastID-3000 {
		t.Fatalf("scenario broken: the late id %d should be 3,000 below the last published id %d", lateID, lastID)
	}

	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := t2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.enqueue(ctx, "late-one")
	e.enqueue(ctx, "late-batch")
	rep := e.check(ctx)
	if want := 2 + 2 + 3000 + 3 + 2; rep.Committed != want {
		t.Fatalf("committed %d rows, want %d", rep.Committed, want)
	}
}
