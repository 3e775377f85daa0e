package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/contract"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/outbox"
)

type bundle struct {
	ctx context.Context
	db  *testkit.DB
}

func setup(t *testing.T) bundle {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	return bundle{ctx: context.Background(), db: testkit.NewDB(t)}
}

func (b bundle) enqueue(t *testing.T, w outbox.Writer, m outbox.Message) (outbox.Result, error) {
	t.Helper()
	var res outbox.Result
	err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = w.Enqueue(b.ctx, tx, m)
		return err
	})
	return res, err
}

func msg(source string) outbox.Message {
	return outbox.Message{Topic: "orders", Source: source, EventType: "order.created", Payload: []byte(`{"n":1}`)}
}

func TestEnqueueRefusesBadInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		w      outbox.Writer
		mutate func(*outbox.Message)
		field  string
	}{
		{"empty source", outbox.Writer{}, func(m *outbox.Message) { m.Source = "" }, "source"},
		{"empty type", outbox.Writer{}, func(m *outbox.Message) { m.EventType = "" }, "event-type"},
		{"empty topic", outbox.Writer{}, func(m *outbox.Message) { m.Topic = "" }, "topic"},
		{"topic with a space", outbox.Writer{}, func(m *outbox.Message) { m.Topic = "bad topic" }, "topic"},
		{"topic dot dot", outbox.Writer{}, func(m *outbox.Message) { m.Topic = ".." }, "topic"},
		{"topic not ASCII", outbox.Writer{}, func(m *outbox.Message) { m.Topic = "commandes-é" }, "topic"},
		{"topic too long", outbox.Writer{}, func(m *outbox.Message) { m.Topic = strings.Repeat("t", 250) }, "topic"},
		{"line break in source", outbox.Writer{}, func(m *outbox.Message) { m.Source = "a\nb" }, "source"},
		{"line break in event id", outbox.Writer{}, func(m *outbox.Message) { m.EventID = "e\r1" }, "event-id"},
		{"payload over limit", outbox.Writer{MaxPayloadBytes: 8}, func(m *outbox.Message) { m.Payload = []byte(`{"long":"payload"}`) }, "payload"},
		{"payload over default limit", outbox.Writer{}, func(m *outbox.Message) {
			m.ContentType = "application/octet-stream"
			m.Payload = make([]byte, 1<<20+1)
		}, "payload"},
		{"payload not JSON", outbox.Writer{}, func(m *outbox.Message) { m.Payload = []byte("nope") }, "payload"},
		{"reserved header", outbox.Writer{}, func(m *outbox.Message) { m.Headers = map[string]string{"seq": "9"} }, "headers"},
		{"invalid UTF-8 header", outbox.Writer{}, func(m *outbox.Message) { m.Headers = map[string]string{"x": "\xff"} }, "headers"},
		{"bad content type", outbox.Writer{}, func(m *outbox.Message) { m.ContentType = "///" }, "content-type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := msg("s")
			tt.mutate(&m)
			// No database needed: validation happens before any statement.
			_, err := tt.w.Enqueue(context.Background(), nil, m)
			var fe *outbox.FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field {
				t.Fatalf("Enqueue = %v, want a FieldError for %q", err, tt.field)
			}
		})
	}
}

// TestEnqueuePayloadCheck: Writer.PayloadCheck sees the topic and payload
// of every event, and its error refuses the event before any statement (no
// database here), returned as it is.
func TestEnqueuePayloadCheck(t *testing.T) {
	t.Parallel()
	misfit := errors.New("does not fit")
	var asked []string
	w := outbox.Writer{PayloadCheck: func(topic string, payload []byte) error {
		asked = append(asked, topic+" "+string(payload))
		return misfit
	}}
	if _, err := w.Enqueue(context.Background(), nil, msg("s")); !errors.Is(err, misfit) {
		t.Fatalf("Enqueue = %v, want the check's error", err)
	}
	if _, err := w.EnqueueBatch(context.Background(), nil, []outbox.Message{msg("s")}); !errors.Is(err, misfit) {
		t.Fatalf("EnqueueBatch = %v, want the check's error", err)
	}
	if want := []string{`orders {"n":1}`, `orders {"n":1}`}; fmt.Sprint(asked) != fmt.Sprint(want) {
		t.Fatalf("checked %q, want %q", asked, want)
	}
}

func TestEnqueueSeqPerSource(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i, src := range []string{"a", "a", "b", "a"} {
		res, err := b.enqueue(t, outbox.Writer{}, msg(src))
		if err != nil {
			t.Fatal(err)
		}
		want := []int64{1, 2, 1, 3}[i]
		if res.Seq != want || res.EventID == "" {
			t.Fatalf("event %d: got %+v, want seq %d and a generated id", i, res, want)
		}
	}
}

func TestEnqueueRollbackBurnsNoSeq(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.enqueue(t, outbox.Writer{}, msg("a")); err != nil {
		t.Fatal(err)
	}
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := outbox.Enqueue(b.ctx, tx, msg("a")); err != nil || r.Seq != 2 {
		t.Fatalf("in tx: %+v %v", r, err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	res, err := b.enqueue(t, outbox.Writer{}, msg("a"))
	if err != nil || res.Seq != 2 {
		t.Fatalf("after rollback got %+v %v, want seq 2", res, err)
	}
}

// An EventID that exists is an error naming it (the documented behaviour),
// and the first event is unchanged.
func TestEnqueueDuplicateEventID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := msg("order-88")
	m.EventID = "billing:order-88:refund_issued"
	first, err := b.enqueue(t, outbox.Writer{}, m)
	if err != nil || first.EventID != m.EventID || first.Seq != 1 {
		t.Fatalf("first: %+v %v", first, err)
	}
	_, err = b.enqueue(t, outbox.Writer{}, m)
	var de *outbox.DuplicateEventError
	if !errors.As(err, &de) || !errors.Is(err, outbox.ErrDuplicateEventID) || !strings.Contains(err.Error(), m.EventID) {
		t.Fatalf("second: %v, want a DuplicateEventError naming %s", err, m.EventID)
	}
	var n, last int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM onceflow.outbox), (SELECT max(last_seq) FROM onceflow.source_seq_moves WHERE source = 'order-88')`).Scan(&n, &last); err != nil {
		t.Fatal(err)
	}
	if n != 1 || last != 1 {
		t.Fatalf("after the duplicate: %d rows, last_seq %d; want 1 and 1", n, last)
	}
}

func TestEnqueueBatchOrderAndResults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msgs := []outbox.Message{msg("z"), msg("a"), msg("z"), msg("m"), msg("a")}
	var res []outbox.Result
	err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = outbox.EnqueueBatch(b.ctx, tx, msgs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wantSeq := []int64{1, 1, 2, 1, 2}
	for i, r := range res {
		if r.Seq != wantSeq[i] {
			t.Fatalf("result %d (%s): seq %d, want %d", i, msgs[i].Source, r.Seq, wantSeq[i])
		}
	}
	// Counters were locked in source order: ids follow a, a, m, z, z.
	rows, err := b.db.Pool.Query(b.ctx, `SELECT source FROM onceflow.outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "a,a,m,z,z" {
		t.Fatalf("insert order %v, want sorted by source", got)
	}
	// A bad message refuses the whole batch, naming its index and field.
	_, err = outbox.EnqueueBatch(b.ctx, nil, []outbox.Message{msg("a"), {Topic: "t", Source: "b", Payload: []byte("{}")}})
	if err == nil || !strings.Contains(err.Error(), "message 1") || !strings.Contains(err.Error(), "event-type") {
		t.Fatalf("bad batch: %v", err)
	}
}

func TestEnqueueHeadersKeyTraceparentStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	m := msg("s")
	m.Key = []byte("k1")
	m.Headers = map[string]string{"tenant": "acme"}
	m.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if _, err := b.enqueue(t, outbox.Writer{}, m); err != nil {
		t.Fatal(err)
	}
	var key []byte
	var tenant, tp string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT record_key, headers->>'tenant', headers->>'traceparent' FROM onceflow.outbox`).Scan(&key, &tenant, &tp); err != nil {
		t.Fatal(err)
	}
	if string(key) != "k1" || tenant != "acme" || tp != m.Traceparent {
		t.Fatalf("stored key %q tenant %q traceparent %q", key, tenant, tp)
	}
}

// EnqueueBatch writes a batch in one statement: every row as Enqueue would
// write it, each result matched to its message (generated ids too), seqs
// continuing the counters, a duplicate event id refused naming it.
func TestEnqueueBatchRowsAndResults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := func(msgs []outbox.Message) ([]outbox.Result, error) {
		var res []outbox.Result
		err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			res, err = outbox.EnqueueBatch(b.ctx, tx, msgs)
			return err
		})
		return res, err
	}
	if res, err := batch(nil); err != nil || res != nil {
		t.Fatalf("empty batch: %v %v", res, err)
	}
	// The counter of "b" already stands at 2.
	for range 2 {
		if _, err := b.enqueue(t, outbox.Writer{}, msg("b")); err != nil {
			t.Fatal(err)
		}
	}
	var msgs []outbox.Message
	for i := range 30 {
		m := msg([]string{"c", "b", "a"}[i%3])
		m.ContentType = "application/octet-stream"
		m.Payload = []byte{byte(i), 0, 0xff}
		if i%5 == 0 {
			m.EventID = "given-" + string(rune('A'+i))
		}
		if i%7 == 0 {
			m.Key = []byte{'k', byte('0' + i%10)}
			m.Headers = map[string]string{"tenant": "t" + string(rune('0'+i%10))}
			m.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		}
		msgs = append(msgs, m)
	}
	res, err := batch(msgs)
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]int64{"a": 1, "b": 3, "c": 1}
	for i, m := range msgs {
		r := res[i]
		if r.Seq != next[m.Source] {
			t.Fatalf("message %d (%s): seq %d, want %d", i, m.Source, r.Seq, next[m.Source])
		}
		next[m.Source]++
		if m.EventID != "" && r.EventID != m.EventID {
			t.Fatalf("message %d: event id %q, want the given %q", i, r.EventID, m.EventID)
		}
		var source, ct, headers string
		var seq int64
		var key, payload []byte
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT source, seq, content_type, record_key, headers::text, payload FROM onceflow.outbox WHERE event_id = $1`, r.EventID).
			Scan(&source, &seq, &ct, &key, &headers, &payload); err != nil {
			t.Fatalf("message %d: row %q: %v", i, r.EventID, err)
		}
		if source != m.Source || seq != r.Seq || ct != m.ContentType || string(key) != string(m.Key) || string(payload) != string(m.Payload) {
			t.Fatalf("message %d: row %s/%d %q key %q payload %x, want %s/%d %q key %q payload %x", i, source, seq, ct, key, payload, m.Source, r.Seq, m.ContentType, m.Key, m.Payload)
		}
		if m.Headers != nil && (!strings.Contains(headers, `"tenant": "`+m.Headers["tenant"]+`"`) || !strings.Contains(headers, m.Traceparent)) {
			t.Fatalf("message %d: headers %s", i, headers)
		}
		if m.Headers == nil && headers != "{}" {
			t.Fatalf("message %d: headers %s, want {}", i, headers)
		}
	}
	// Per source, id order is seq order.
	var bad int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM (SELECT seq < lag(seq) OVER (PARTITION BY source ORDER BY id) AS back FROM onceflow.outbox) x WHERE back`).Scan(&bad); err != nil || bad != 0 {
		t.Fatalf("%d rows whose seq goes back in id order (%v)", bad, err)
	}
	// A duplicate (already stored, or twice in the batch) refuses the batch
	// and names the event id; the counters stay.
	for _, dup := range [][]outbox.Message{
		{msg("a"), func() outbox.Message { m := msg("d"); m.EventID = "given-A"; return m }()},
		{func() outbox.Message { m := msg("e"); m.EventID = "twice"; return m }(), func() outbox.Message { m := msg("e"); m.EventID = "twice"; return m }()},
	} {
		_, err := batch(dup)
		var de *outbox.DuplicateEventError
		if !errors.As(err, &de) || de.EventID != dup[len(dup)-1].EventID {
			t.Fatalf("duplicate batch: %v, want a DuplicateEventError naming %q", err, dup[len(dup)-1].EventID)
		}
	}
	var last int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT max(last_seq) FROM onceflow.source_seq_moves WHERE source = 'a'`).Scan(&last); err != nil || last != 10 {
		t.Fatalf("counter of a after refused batches: %d (%v), want 10", last, err)
	}
}

// onceflow.enqueue and Go's Enqueue take their seq as the batch paths do
// (onceflow.next_seqs locks the stream's counter, the insert names the
// seq), so the row trigger
// outbox_assign_seq, whose look-up of the statement's earlier rows reads
// every partition of the outbox (migration 034), does not run. Calls in one
// transaction, in one statement or several, on two streams, get seqs that
// follow one another, in id order; the counter moves with each call.
func TestSQLEnqueueNamesItsSeq(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	conn, err := b.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET track_functions = 'all'`); err != nil {
		t.Fatal(err)
	}
	var assign, next int64
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, q := range []string{
			`SELECT onceflow.enqueue('orders', 'named-a', 'x', '{}')`,
			`SELECT onceflow.enqueue('orders', 'named-b', 'x', '{}')`,
			`SELECT onceflow.enqueue('orders', 'named-a', 'x', '{}') FROM generate_series(1, 3)`,
			`SELECT onceflow.enqueue_batch('[{"topic":"orders","source":"named-a","event_type":"x","payload":{}}]'::jsonb)`,
			`SELECT onceflow.enqueue('orders', 'named-a', 'x', '{}')`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		if _, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: "orders", Source: "named-b", EventType: "x", Payload: []byte(`{}`)}); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `
			SELECT coalesce(sum(s.calls) FILTER (WHERE s.funcname = 'outbox_assign_seq'), 0),
			       coalesce(sum(s.calls) FILTER (WHERE s.funcname = 'next_seqs'), 0)
			  FROM pg_stat_xact_user_functions s WHERE s.schemaname = 'onceflow'`).Scan(&assign, &next)
	}); err != nil {
		t.Fatal(err)
	}
	if assign != 0 || next != 8 {
		t.Errorf("outbox_assign_seq ran %d times and next_seqs %d times; want 0 and 8 (one per onceflow.enqueue call, the batch and Go's Enqueue)", assign, next)
	}
	rows, err := b.db.Pool.Query(ctx, `SELECT source, seq FROM onceflow.outbox WHERE source LIKE 'named-%' ORDER BY source, id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var src string
		var seq int64
		err := r.Scan(&src, &seq)
		return fmt.Sprintf("%s:%d", src, seq), err
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "named-a:1 named-a:2 named-a:3 named-a:4 named-a:5 named-a:6 named-b:1 named-b:2"; strings.Join(got, " ") != want {
		t.Errorf("rows in id order per stream: %v, want %s", got, want)
	}
	var last int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT seq FROM onceflow.enqueue('orders', 'named-a', 'x', '{}')`).Scan(&last); err != nil || last != 7 {
		t.Errorf("next call's seq: %d (%v), want 7", last, err)
	}
}

// The SQL function behaves like the Go API for non-Go producers.
func TestSQLEnqueueFunction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var id string
	var seq int64
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT event_id, seq FROM onceflow.enqueue('orders', 'order-88', 'order.created', '{"total": 42}')`).Scan(&id, &seq); err != nil {
		t.Fatal(err)
	}
	if id == "" || seq != 1 {
		t.Fatalf("got (%q, %d)", id, seq)
	}
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT event_id, seq FROM onceflow.enqueue('orders', 'order-88', 'refund_issued', '{}',
		event_id => 'billing:order-88:refund_issued', headers => '{"tenant":"acme"}', key => 'k')`).Scan(&id, &seq); err != nil {
		t.Fatal(err)
	}
	if id != "billing:order-88:refund_issued" || seq != 2 {
		t.Fatalf("got (%q, %d)", id, seq)
	}
	// Every legal topic character passes, at Kafka's length limit.
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT * FROM onceflow.enqueue('Orders.v1_eu-west-' || repeat('9', 231), 's2', 'x', '{}')`); err != nil {
		t.Fatalf("a legal topic name of 249 bytes: %v", err)
	}
	// Go and SQL share the counter.
	if r, err := b.enqueue(t, outbox.Writer{}, msg("order-88")); err != nil || r.Seq != 3 {
		t.Fatalf("Go after SQL: %+v %v", r, err)
	}
	tests := []struct {
		call, sqlstate, mention string
	}{
		{`onceflow.enqueue('orders', 'order-88', 'x', '{}', event_id => 'billing:order-88:refund_issued')`, "23505", "billing:order-88:refund_issued"},
		{`onceflow.enqueue('orders', '', 'x', '{}')`, "22023", "source"},
		{`onceflow.enqueue('orders', 's', '', '{}')`, "22023", "event_type"},
		{`onceflow.enqueue('', 's', 'x', '{}')`, "22023", "topic"},
		{`onceflow.enqueue('orders', 's', 'x', '{}', headers => '{"seq":"1"}')`, "22023", "headers"},
		{`onceflow.enqueue('orders', 's', 'x', '{}', headers => '{"n":1}')`, "22023", "headers"},
		{`onceflow.enqueue('orders', 's', 'x', jsonb_build_object('p', repeat('x', 1100000)))`, "22023", "payload"},
		// The Go API's checks, mirrored by the function since migration 008.
		{`onceflow.enqueue('bad topic', 's', 'x', '{}')`, "22023", "topic"},
		{`onceflow.enqueue('orders!', 's', 'x', '{}')`, "22023", "topic"},
		{`onceflow.enqueue('..', 's', 'x', '{}')`, "22023", "topic"},
		{`onceflow.enqueue('.', 's', 'x', '{}')`, "22023", "topic"},
		{`onceflow.enqueue('commandes-é', 's', 'x', '{}')`, "22023", "topic"},
		{`onceflow.enqueue(repeat('t', 250), 's', 'x', '{}')`, "22023", "topic"},
		{`onceflow.enqueue('orders', 'a' || chr(10) || 'b', 'x', '{}')`, "22023", "source"},
		{`onceflow.enqueue('orders', 's', 'x' || chr(13), '{}')`, "22023", "event_type"},
		{`onceflow.enqueue('orders', 's', 'x', '{}', event_id => 'e' || chr(10))`, "22023", "event_id"},
	}
	for _, tt := range tests {
		_, err := b.db.Pool.Exec(b.ctx, "SELECT * FROM "+tt.call)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != tt.sqlstate || !strings.Contains(pe.Message, tt.mention) {
			t.Errorf("%s: %v, want SQLSTATE %s mentioning %q", tt.call, err, tt.sqlstate, tt.mention)
		}
	}
}

// onceflow.enqueue_batch enqueues an array in one statement like EnqueueBatch,
// and refuses exactly what onceflow.enqueue refuses: every bad case is run
// through both functions (the batch one with a good event before the bad
// one, which it must name as event 2), and nothing is written.
func TestSQLEnqueueBatchFunction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.enqueue(t, outbox.Writer{}, msg("b")); err != nil {
		t.Fatal(err)
	}
	rows, err := b.db.Pool.Query(b.ctx, `SELECT event_id, seq FROM onceflow.enqueue_batch($1::jsonb)`, `[
		{"topic": "orders", "source": "c", "event_type": "x", "payload": {"n": 1}},
		{"topic": "orders", "source": "b", "event_type": "x", "payload": [1, 2], "event_id": "given-1", "headers": {"tenant": "acme"}, "key": "k"},
		{"topic": "orders", "source": "c", "event_type": "x", "payload": null},
		{"topic": "orders", "source": "a", "event_type": "x", "payload": "text"},
		{"topic": "orders", "source": "b", "event_type": "x", "payload": {}}]`)
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		id  string
		seq int64
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (res, error) {
		var x res
		err := r.Scan(&x.id, &x.seq)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	wantSeq := []int64{1, 2, 2, 1, 3}
	if len(got) != len(wantSeq) {
		t.Fatalf("%d results, want %d", len(got), len(wantSeq))
	}
	for i, r := range got {
		if r.seq != wantSeq[i] || r.id == "" || (i == 1 && r.id != "given-1") {
			t.Fatalf("result %d: %+v, want seq %d", i, r, wantSeq[i])
		}
		var source string
		var seq int64
		if err := b.db.Pool.QueryRow(b.ctx, `SELECT source, seq FROM onceflow.outbox WHERE event_id = $1`, r.id).Scan(&source, &seq); err != nil || seq != r.seq {
			t.Fatalf("result %d: row %s/%d (%v)", i, source, seq, err)
		}
	}
	var key, tenant string
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT convert_from(record_key, 'UTF8'), headers->>'tenant' FROM onceflow.outbox WHERE event_id = 'given-1'`).Scan(&key, &tenant); err != nil || key != "k" || tenant != "acme" {
		t.Fatalf("given-1: key %q tenant %q (%v)", key, tenant, err)
	}
	var bad int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM (SELECT seq < lag(seq) OVER (PARTITION BY source ORDER BY id) AS back FROM onceflow.outbox) x WHERE back`).Scan(&bad); err != nil || bad != 0 {
		t.Fatalf("%d rows whose seq goes back in id order (%v)", bad, err)
	}

	// Each case: onceflow.enqueue's arguments as SQL expressions and the
	// same event as a JSON object expression.
	cases := []struct {
		topic, source, eventType, payload, extra string // extra: named arguments of enqueue
		event                                    string
		sqlstate, mention                        string
	}{
		{`'orders'`, `''`, `'x'`, `'{}'`, ``, `jsonb_build_object('topic', 'orders', 'source', '', 'event_type', 'x', 'payload', '{}'::jsonb)`, "22023", "source"},
		{`'orders'`, `'s'`, `''`, `'{}'`, ``, `jsonb_build_object('topic', 'orders', 'source', 's', 'event_type', '', 'payload', '{}'::jsonb)`, "22023", "event_type"},
		{`''`, `'s'`, `'x'`, `'{}'`, ``, `jsonb_build_object('topic', '', 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb)`, "22023", "topic"},
		{`'bad topic'`, `'s'`, `'x'`, `'{}'`, ``, `jsonb_build_object('topic', 'bad topic', 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb)`, "22023", "topic"},
		{`'..'`, `'s'`, `'x'`, `'{}'`, ``, `jsonb_build_object('topic', '..', 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb)`, "22023", "topic"},
		{`'commandes-é'`, `'s'`, `'x'`, `'{}'`, ``, `jsonb_build_object('topic', 'commandes-é', 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb)`, "22023", "topic"},
		{`repeat('t', 250)`, `'s'`, `'x'`, `'{}'`, ``, `jsonb_build_object('topic', repeat('t', 250), 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb)`, "22023", "topic"},
		{`'orders'`, `repeat('s', 513)`, `'x'`, `'{}'`, ``, `jsonb_build_object('topic', 'orders', 'source', repeat('s', 513), 'event_type', 'x', 'payload', '{}'::jsonb)`, "22023", "source"},
		{`'orders'`, `'a' || chr(10) || 'b'`, `'x'`, `'{}'`, ``, `jsonb_build_object('topic', 'orders', 'source', 'a' || chr(10) || 'b', 'event_type', 'x', 'payload', '{}'::jsonb)`, "22023", "source"},
		{`'orders'`, `'s'`, `'x' || chr(13)`, `'{}'`, ``, `jsonb_build_object('topic', 'orders', 'source', 's', 'event_type', 'x' || chr(13), 'payload', '{}'::jsonb)`, "22023", "event_type"},
		{`'orders'`, `'s'`, `'x'`, `'{}'`, `, event_id => 'e' || chr(10)`, `jsonb_build_object('topic', 'orders', 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb, 'event_id', 'e' || chr(10))`, "22023", "event_id"},
		{`'orders'`, `'s'`, `'x'`, `'{}'`, `, event_id => ''`, `jsonb_build_object('topic', 'orders', 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb, 'event_id', '')`, "22023", "event_id"},
		{`'orders'`, `'s'`, `'x'`, `'{}'`, `, headers => '{"seq":"1"}'`, `jsonb_build_object('topic', 'orders', 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb, 'headers', '{"seq":"1"}'::jsonb)`, "22023", "headers"},
		{`'orders'`, `'s'`, `'x'`, `'{}'`, `, headers => '{"n":1}'`, `jsonb_build_object('topic', 'orders', 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb, 'headers', '{"n":1}'::jsonb)`, "22023", "headers"},
		{`'orders'`, `'s'`, `'x'`, `jsonb_build_object('p', repeat('x', 1100000))`, ``, `jsonb_build_object('topic', 'orders', 'source', 's', 'event_type', 'x', 'payload', jsonb_build_object('p', repeat('x', 1100000)))`, "22023", "payload"},
		{`'orders'`, `'s'`, `'x'`, `'{}'`, `, event_id => 'given-1'`, `jsonb_build_object('topic', 'orders', 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb, 'event_id', 'given-1')`, "23505", "given-1"},
	}
	var before int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		single := fmt.Sprintf("SELECT * FROM onceflow.enqueue(%s, %s, %s, %s%s)", tc.topic, tc.source, tc.eventType, tc.payload, tc.extra)
		batch := fmt.Sprintf(`SELECT * FROM onceflow.enqueue_batch(jsonb_build_array(jsonb_build_object('topic', 'orders', 'source', 'ok', 'event_type', 'x', 'payload', '{}'::jsonb), %s))`, tc.event)
		for _, call := range []string{single, batch} {
			_, err := b.db.Pool.Exec(b.ctx, call)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != tc.sqlstate || !strings.Contains(pe.Message, tc.mention) {
				t.Errorf("%.120s: %v, want SQLSTATE %s mentioning %q", call, err, tc.sqlstate, tc.mention)
				continue
			}
			if call == batch && tc.sqlstate == "22023" && !strings.Contains(pe.Message, "event 2") {
				t.Errorf("%.120s: %q does not name event 2", call, pe.Message)
			}
		}
	}
	// A legal event of each kind of the cases above passes.
	if _, err := b.db.Pool.Exec(b.ctx, `SELECT * FROM onceflow.enqueue_batch(jsonb_build_array(jsonb_build_object('topic', 'Orders.v1_eu-west-' || repeat('9', 231), 'source', 's', 'event_type', 'x', 'payload', '{}'::jsonb, 'headers', '{"tenant": "a"}'::jsonb)))`); err != nil {
		t.Fatalf("a legal event: %v", err)
	}
	for _, bad := range []string{`'{}'`, `'[1]'`, `NULL`} {
		if _, err := b.db.Pool.Exec(b.ctx, `SELECT * FROM onceflow.enqueue_batch(`+bad+`::jsonb)`); err == nil {
			t.Errorf("enqueue_batch(%s) passed", bad)
		}
	}
	var after int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&after); err != nil || after != before+1 {
		t.Fatalf("%d rows after the refused calls and one legal one, want %d (%v)", after, before+1, err)
	}
}

// A Writer with payload schemas refuses a payload that breaks its event
// type's schema, naming the violation, and writes nothing.
func TestEnqueuePayloadSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	schemas, err := envelope.LoadPayloadSchemas(contract.Payloads, "payloads")
	if err != nil {
		t.Fatal(err)
	}
	w := outbox.Writer{PayloadSchemas: schemas}
	good := msg("order-1")
	good.EventType = "example.order_placed" // the contract's example schema
	good.Payload = []byte(`{"order_id":"o-1","total_cents":1200,"currency":"EUR"}`)
	if _, err := b.enqueue(t, w, good); err != nil {
		t.Fatalf("conforming payload refused: %v", err)
	}
	bad := msg("order-1")
	bad.EventType = "example.order_placed"
	bad.Payload = []byte(`{"order_id":"o-2","total_cents":-5,"currency":"EUR"}`)
	_, err = b.enqueue(t, w, bad)
	var pe *envelope.PayloadError
	if !errors.As(err, &pe) || pe.EventType != "example.order_placed" || !strings.Contains(err.Error(), "total_cents") {
		t.Fatalf("payload breaking the schema: err = %v, want a PayloadError naming total_cents", err)
	}
	other := msg("order-1")
	other.EventType = "order.noted" // no schema: passes
	if _, err := b.enqueue(t, w, other); err != nil {
		t.Fatalf("event type without a schema refused: %v", err)
	}
	var n int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("outbox holds %d rows (%v), want 2", n, err)
	}
}
