package inbox

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// A snapshot held for long keeps every seq_applied entry a stream moved
// past. The read an Effecter's batch makes before its effects (qPeek) must
// not cost more as that history grows: 300 streams that moved 300 times
// under the snapshot cost about what 300 streams that moved twice cost.
// With max(), after ANALYZE (statistics of one live row per stream), the
// planner read each stream's whole range by a bitmap scan: every kept entry
// and its heap page. The buffers are the transaction's own counts
// (pg_stat_get_xact_blocks_fetched), so the machine's load does not move
// them.
func TestPeekHeldSnapshotCostFlat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testkit.NewDB(t)
	const consumer, streams = "peek", 300

	defer testkit.HoldSnapshot(t, db.URL)()

	// moves starts streams prefix-0 … prefix-299 and moves each one's
	// last_applied on n times, round by round (so that a stream's kept
	// entries lie on many heap pages, as a consumer's batches leave them).
	moves := func(prefix string, n int) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `
INSERT INTO onceflow.seq_state (consumer, source, producer, topic, last_applied)
SELECT $1, $2 || g, 'p', 't', 0 FROM generate_series(0, $3 - 1) g`, consumer, prefix, streams); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `
DO $$
BEGIN
    FOR r IN 1..`+fmt.Sprint(n)+` LOOP
        DELETE FROM onceflow.seq_applied
         WHERE (consumer, source, producer, topic, last_applied) IN (
               SELECT '`+consumer+`', '`+prefix+`' || g, 'p', 't', r - 1 FROM generate_series(0, `+fmt.Sprint(streams-1)+`) g);
        INSERT INTO onceflow.seq_applied (consumer, source, producer, topic, last_applied)
        SELECT '`+consumer+`', '`+prefix+`' || g, 'p', 't', r FROM generate_series(0, `+fmt.Sprint(streams-1)+`) g;
    END LOOP;
END $$`); err != nil {
			t.Fatal(err)
		}
	}
	moves("short-", 2)
	moves("long-", 300)
	if _, err := db.Pool.Exec(ctx, `ANALYZE onceflow.seq_applied, onceflow.seq_state`); err != nil {
		t.Fatal(err)
	}

	// blocks peeks at the next event of every stream of prefix and returns
	// the buffers the read fetched from seq_applied and its key.
	blocks := func(prefix string, next int64) int64 {
		t.Helper()
		items := make([]item, streams)
		for i := range items {
			ev := Event{Envelope: envelope.Envelope{EventID: fmt.Sprintf("%s%d-%d", prefix, i, next), Source: fmt.Sprintf("%s%d", prefix, i), Seq: next, Producer: "p"}, Topic: "t"}
			items[i] = item{ev: ev, key: ev.EventID}
		}
		// A connection of its own: a backend's counts include what it has
		// not reported yet, so a pooled one would add earlier work.
		conn, err := pgx.Connect(ctx, db.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var n int64
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			rows, err := peekRows(ctx, tx, consumer, items)
			if err != nil {
				return err
			}
			for i, r := range rows {
				if r.lastApplied == nil || *r.lastApplied != next-1 || r.known || r.openGap {
					return fmt.Errorf("stream %s: peeked %+v, want last applied %d", items[i].ev.Source, r, next-1)
				}
			}
			return tx.QueryRow(ctx, `
SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) FROM pg_class c
WHERE c.relnamespace = 'onceflow'::regnamespace AND c.relname IN ('seq_applied', 'seq_applied_pkey')`).Scan(&n)
		})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	short, long := blocks("short-", 3), blocks("long-", 301)
	t.Logf("buffers read by one peek of %d streams: %d after 2 moves each, %d after 300 (a snapshot held throughout)", streams, short, long)
	if long > 2*short+50 {
		t.Fatalf("a peek of %d streams read %d buffers after 300 moves each under a held snapshot, %d after 2: the cost grows with the history", streams, long, short)
	}
}
