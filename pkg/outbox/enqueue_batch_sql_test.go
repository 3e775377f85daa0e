package outbox_test

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/migrations"
)

// onceflow.enqueue_batch as migration 014 (enqueue_batch_fast) rewrote it
// for speed refuses and accepts exactly what migration 010's body does: the
// same events, the same SQLSTATEs, the same messages word for word, the
// same first bad event named. 010's body runs beside it as
// public.enqueue_batch_010, and every case goes through both (each in a
// transaction that is rolled back, so both see the same table).
func TestSQLEnqueueBatchSameAs010(t *testing.T) {
	t.Parallel()
	b := setup(t)
	up, err := migrations.FS.ReadFile("010_enqueue_batch.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	old := strings.Replace(string(up), "CREATE FUNCTION onceflow.enqueue_batch(", "CREATE FUNCTION public.enqueue_batch_010(", 1)
	if old == string(up) {
		t.Fatal("010_enqueue_batch.up.sql: no CREATE FUNCTION onceflow.enqueue_batch")
	}
	// Since migration 015 the trigger outbox_assign_seq gives every row its
	// seq and the counters are per (source, topic): 010's per-source counter
	// upsert becomes a read of the outbox. Every case writes one topic per
	// source, where the two kinds of seq agree.
	const counter010 = `c AS (
        INSERT INTO onceflow.source_seq AS c (source, last_seq)
        SELECT n.source, n.n FROM n ORDER BY n.source
        ON CONFLICT (source) DO UPDATE SET last_seq = c.last_seq + excluded.last_seq
        RETURNING c.source, c.last_seq
    )`
	if !strings.Contains(old, counter010) {
		t.Fatal("010_enqueue_batch.up.sql: no per-source counter upsert")
	}
	old = strings.Replace(old, counter010, `c AS (
        SELECT n.source, coalesce((SELECT max(o.seq) FROM onceflow.outbox o WHERE o.source = n.source), 0) + n.n AS last_seq FROM n
    )`, 1)
	if _, err := b.db.Pool.Exec(b.ctx, old[strings.Index(old, "CREATE FUNCTION"):]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT * FROM onceflow.enqueue_batch('[{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": "taken"}]')`); err != nil {
		t.Fatal(err)
	}

	good := `{"topic": "orders", "source": "ok", "event_type": "x", "payload": {}}`
	long := func(n int) string { return strings.Repeat("a", n) }
	cases := []string{
		// Not an object.
		`5`, `"x"`, `null`, `[1]`, `true`,
		// topic.
		`{"source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": "", "source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": null, "source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": "` + long(250) + `", "source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": "bad topic", "source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": "orders!", "source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": ".", "source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": "..", "source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": "commandes-é", "source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": "a\nb", "source": "s", "event_type": "x", "payload": {}}`,
		`{"topic": {"a": 1}, "source": "s", "event_type": "x", "payload": {}}`,
		// source.
		`{"topic": "t", "event_type": "x", "payload": {}}`,
		`{"topic": "t", "source": "", "event_type": "x", "payload": {}}`,
		`{"topic": "t", "source": "` + long(513) + `", "event_type": "x", "payload": {}}`,
		`{"topic": "t", "source": "a\nb", "event_type": "x", "payload": {}}`,
		`{"topic": "t", "source": "a\rb", "event_type": "x", "payload": {}}`,
		// event_type.
		`{"topic": "t", "source": "s", "payload": {}}`,
		`{"topic": "t", "source": "s", "event_type": "", "payload": {}}`,
		`{"topic": "t", "source": "s", "event_type": "` + long(257) + `", "payload": {}}`,
		`{"topic": "t", "source": "s", "event_type": "x\r", "payload": {}}`,
		// event_id.
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": ""}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": "` + long(513) + `"}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": "e\n"}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": "taken"}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": "fresh"}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": null}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": 42}`,
		// payload.
		`{"topic": "t", "source": "s", "event_type": "x"}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": null}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": "` + long(1048577) + `"}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": "` + long(1048574) + `"}`,
		// headers.
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": null}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": []}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": "x"}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": {}}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": {"tenant": "a"}}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": {"n": 1}}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": {"": "a"}}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": {"Event-Id": "a"}}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": {"traceparent": "a"}}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "headers": {"k": "` + long(8192) + `"}}`,
		// key.
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "key": 5}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "key": {}}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "key": null}`,
		`{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "key": "k"}`,
		// Several faults: the first check in onceflow.enqueue's order wins.
		`{"topic": "bad topic", "source": "", "payload": {}}`,
		`{"topic": "t", "source": "a\nb", "event_type": "", "key": 5}`,
		`{"topic": "t", "source": "s", "event_type": "x\n", "event_id": "", "headers": 1}`,
		`{"topic": "t", "source": "s", "event_type": "x", "headers": {"seq": "1"}, "key": []}`,
	}
	type outcome struct {
		code, msg string
		seqs      []int64
		rows      string
	}
	run := func(fn, events string) outcome {
		t.Helper()
		var o outcome
		tx, err := b.db.Pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(b.ctx) //nolint:errcheck
		rows, err := tx.Query(b.ctx, `SELECT seq FROM `+fn+`($1::jsonb)`, events)
		if err == nil {
			o.seqs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			o.code, o.msg = pe.Code, strings.Replace(pe.Message, "public.enqueue_batch_010", "onceflow.enqueue_batch", 1)
			return o
		}
		if err != nil {
			t.Fatalf("%s: %v", fn, err)
		}
		// What was stored, but for generated event ids.
		err = tx.QueryRow(b.ctx, `SELECT coalesce(string_agg(concat_ws(' ', CASE WHEN event_id IN ('taken', 'fresh', '42') THEN event_id END,
			topic, source, seq, event_type, content_type, encode(record_key, 'escape'), headers::text, md5(payload)), '; ' ORDER BY id), '')
			FROM onceflow.outbox WHERE event_id <> 'taken'`).Scan(&o.rows)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	arrays := []string{`{}`, `[]`, `"x"`, `[` + good + `, ` + good + `]`}
	for _, c := range cases {
		arrays = append(arrays, `[`+good+`, `+c+`]`)
	}
	arrays = append(arrays,
		// Two events with one new event_id: the insert's unique violation.
		`[{"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": "twice"},
		  {"topic": "t", "source": "s", "event_type": "x", "payload": {}, "event_id": "twice"}]`,
		// The first bad event is named, not the first fault found.
		`[`+good+`, {"topic": "t", "source": "s", "event_type": "x"}, {"topic": "bad topic", "source": "s", "event_type": "x", "payload": {}}]`)
	refused := 0
	for _, events := range arrays {
		want, got := run("public.enqueue_batch_010", events), run("onceflow.enqueue_batch", events)
		if want.code != "" {
			refused++
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%.160s:\n  010: %+v\n  now: %+v", events, want, got)
		}
	}
	if refused < 40 {
		t.Fatalf("only %d of %d cases were refused: the cases do not test the checks", refused, len(arrays))
	}
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows after the rolled back cases, want 1 (%v)", n, err)
	}
}

// Generated event ids are UUIDv7, like Go's: version 7, the RFC 9562
// variant, the database's clock in their first 48 bits, all distinct.
func TestSQLEnqueueGeneratesUUIDv7(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var before, after time.Time
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	rows, err := b.db.Pool.Query(b.ctx, `SELECT event_id FROM onceflow.enqueue_batch(
		(SELECT jsonb_agg(jsonb_build_object('topic', 't', 'source', 's' || (g % 3), 'event_type', 'x', 'payload', g)) FROM generate_series(1, 500) g))`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	// onceflow.enqueue makes the same kind of id.
	rows, err = b.db.Pool.Query(b.ctx, `SELECT (onceflow.enqueue('t', 's' || g, 'x', to_jsonb(g))).event_id FROM generate_series(1, 20) g`)
	if err != nil {
		t.Fatal(err)
	}
	one, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, one...)
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	v7 := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for _, id := range ids {
		if !v7.MatchString(id) || seen[id] {
			t.Fatalf("event id %q: not a UUIDv7, or repeated", id)
		}
		seen[id] = true
		var ms int64
		if _, err := fmt.Sscanf(strings.ReplaceAll(id[:13], "-", ""), "%x", &ms); err != nil {
			t.Fatal(err)
		}
		if at := time.UnixMilli(ms); at.Before(before.Truncate(time.Millisecond)) || at.After(after) {
			t.Fatalf("event id %q: time %s is not between %s and %s", id, at, before, after)
		}
	}
	if len(ids) != 520 {
		t.Fatalf("%d ids, want 520", len(ids))
	}
}
