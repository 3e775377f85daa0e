package itest

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestRelayPointInTimeRestoreRefuses: the database is restored in place
// (same cluster, same oid, so the identity check passes) to a point before
// the relay's last publishes, as a point-in-time recovery leaves it: the
// rows written after the point are gone, the per-source counters are back
// at their values then, the publish log lacks the batches marked after the
// point (their rows are queued again), and the outbox's id sequence is up to
// 32 values ahead of the last id (PostgreSQL WAL-logs sequences 32 values in
// advance). Producers then write new events, which take the lost events'
// seqs again. The relay must refuse to publish in both cases: 5 rows after
// the point (inside the sequence's prefetch, where the id check alone saw
// nothing) and 40 (beyond it).
func TestRelayPointInTimeRestoreRefuses(t *testing.T) {
	t.Parallel()
	for _, after := range []int{5, 40} {
		t.Run(fmt.Sprintf("%d rows after the point", after), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			e := newRelayEnv(t, 1)
			const point = 20
			e.enqueueN(ctx, e.db, "s", "before-", point)
			p := e.start("relay", nil, "-holder-id", "r")
			waitPublished(t, ctx, e, point)
			e.enqueueN(ctx, e.db, "s", "lost-", after)
			waitPublished(t, ctx, e, point+after)
			p.Kill()
			<-p.Done()

			// The restore: rows, counter, publish log and queue as they were
			// at the point; the sequence as far ahead as PostgreSQL may have
			// logged it.
			if _, err := e.db.Pool.Exec(ctx, fmt.Sprintf(`
				INSERT INTO onceflow.outbox_pending (id)
				SELECT u.id FROM onceflow.outbox_published l CROSS JOIN LATERAL unnest(l.ids) AS u(id)
				 WHERE l.last_id > %[1]d AND u.id <= %[1]d
				ON CONFLICT DO NOTHING;
				DELETE FROM onceflow.outbox_published WHERE last_id > %[1]d;
				DELETE FROM onceflow.outbox WHERE id > %[1]d;
				UPDATE onceflow.source_seq SET last_seq = %[1]d WHERE source = 's';
				DELETE FROM onceflow.source_seq_moves WHERE source = 's' AND last_seq > %[1]d;
				SELECT setval(pg_get_serial_sequence('onceflow.outbox', 'id'), %[1]d + 32);`, point)); err != nil {
				t.Fatal(err)
			}
			e.enqueueN(ctx, e.db, "s", "new-", 3) // seqs point+1 … point+3, already on the topic
			out := waitExit(t, ctx, e.start("relay-restored", nil, "-holder-id", "r"))
			if !strings.Contains(out, "restored to an earlier point") || !strings.Contains(out, "relay identity reset") {
				t.Fatalf("the relay of the restored database did not refuse; output:\n%s", out)
			}
			var published int
			if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox WHERE event_id LIKE 'new-%' AND id NOT IN (SELECT id FROM onceflow.outbox_pending)`).Scan(&published); err != nil || published != 0 {
				t.Fatalf("the refusing relay published or marked %d new rows (%v)", published, err)
			}
			perSource := publishedPerSource(t, ctx, e.topic)
			if n := len(perSource["s"]); n != point+after {
				t.Fatalf("%d records of s on the topic, want %d (nothing after the restore)", n, point+after)
			}
			line := ""
			if m := reStopped.FindStringSubmatch(out); m != nil {
				line = m[1]
			}
			t.Logf("restored %d rows before the last publish, 3 new events: refused (%s); %d records on the topic", after, line, len(perSource["s"]))
		})
	}
}

var reStopped = regexp.MustCompile(`"msg":"relay stopped: (.*?)","shard"`)
