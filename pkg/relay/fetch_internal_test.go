package relay

import (
	"context"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestSelectBatchMeasuresBeforeReading: the poll statement returns a row
// over the byte budget without its values (its size says why), and ends a
// batch before the row that would take it over the budget; the rows come
// back in id order.
func TestSelectBatchMeasuresBeforeReading(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	const budget = 4 << 20
	// a: 1.5 MiB, b: 5 MiB (over), c, d, e: 1.5 MiB each; random bytes, so
	// that the stored size is the real one. Each row weighs its payload, key,
	// headers (as text), names and 64 bytes. Rows over 1 MiB are what a
	// database from before migration 018 may hold: its limit is lifted.
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE onceflow.outbox DROP CONSTRAINT outbox_payload_max`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload, record_key, headers)
		SELECT 'ev-' || s, 't', 'src-' || s, 1, 'e',
		       (SELECT string_agg(decode(md5(s || g::text), 'hex'), ''::bytea) FROM generate_series(1, CASE WHEN s = 'b' THEN 5 ELSE 1.5 END * 65536) g),
		       CASE WHEN s = 'b' THEN '\x6b6579'::bytea END, CASE WHEN s = 'b' THEN '{"h": "v"}'::jsonb ELSE '{}'::jsonb END
		  FROM unnest(ARRAY['a', 'b', 'c', 'd', 'e']) WITH ORDINALITY AS x(s, n) ORDER BY n`); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Pool.Query(ctx, qSelectBatch, 1000, []int64{}, budget, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type got struct {
		source         string
		size           int64
		payload, key   int
		headersLoaded  bool
		eventIDPresent bool
	}
	var out []got
	for rows.Next() {
		var w row
		var hs []byte
		if err := rows.Scan(&w.id, &w.eventID, &w.topic, &w.source, &w.seq, &w.eventType, &w.contentType, &w.key, &hs, &w.payload, &w.retrying, &w.size); err != nil {
			t.Fatal(err)
		}
		out = append(out, got{w.source, w.size, len(w.payload), len(w.key), hs != nil, w.eventID != ""})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("batch: %+v", out)
	// a (1.5 MiB) + b (not read) + c (1.5 MiB) = 3 MiB; d would make 4.5.
	if len(out) != 3 || out[0].source != "src-a" || out[1].source != "src-b" || out[2].source != "src-c" {
		t.Fatalf("batch %+v: want src-a, src-b (unread), src-c", out)
	}
	if b := out[1]; b.size <= budget || b.payload != 0 || b.key != 0 || b.headersLoaded || !b.eventIDPresent {
		t.Errorf("the oversized row came back with its values or without its size: %+v", b)
	}
	for _, w := range []got{out[0], out[2]} {
		if w.payload != 1536<<10 || w.size != int64(w.payload)+2+4+1+5+1+16+64 {
			t.Errorf("row %s: payload %d bytes, size %d", w.source, w.payload, w.size)
		}
	}
}
