package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// streamSeqs is, per topic, the seqs of source src in id order.
func (b bundle) streamSeqs(t *testing.T, src string) map[string][]int64 {
	t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, `SELECT topic, seq FROM onceflow.outbox WHERE source = $1 ORDER BY id`, src)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int64{}
	for rows.Next() {
		var topic string
		var seq int64
		if err := rows.Scan(&topic, &seq); err != nil {
			t.Fatal(err)
		}
		out[topic] = append(out[topic], seq)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// oneToN reports whether seqs are exactly 1, 2, …, n.
func oneToN(seqs []int64, n int) bool {
	if len(seqs) != n {
		return false
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			return false
		}
	}
	return true
}

// TestStreamSeqPerTopic: one source (an aggregate) writes 10 events
// alternating between two topics, through every way into the outbox: the Go
// API (Enqueue, EnqueueBatch), the SQL functions (enqueue, enqueue_batch), a
// hand-written INSERT naming the seqs onceflow.next_seqs gave and one naming
// none, and COPY naming none.
// Each topic's seqs are 1..5, in id order, with no gap for the other topic's
// events; what each call returned is what was stored.
func TestStreamSeqPerTopic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := func(i int) string { return [2]string{"orders", "emails"}[i%2] }
	const n = 10
	ways := map[string]func(src string) ([]int64, error){
		"Enqueue": func(src string) ([]int64, error) {
			var seqs []int64
			err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
				for i := range n {
					r, err := outbox.Enqueue(b.ctx, tx, outbox.Message{Topic: topic(i), Source: src, EventType: "x", Payload: []byte(`{}`)})
					if err != nil {
						return err
					}
					seqs = append(seqs, r.Seq)
				}
				return nil
			})
			return seqs, err
		},
		"EnqueueBatch": func(src string) ([]int64, error) {
			msgs := make([]outbox.Message, n)
			for i := range msgs {
				msgs[i] = outbox.Message{Topic: topic(i), Source: src, EventType: "x", Payload: []byte(`{}`)}
			}
			var seqs []int64
			err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
				res, err := outbox.EnqueueBatch(b.ctx, tx, msgs)
				for _, r := range res {
					seqs = append(seqs, r.Seq)
				}
				return err
			})
			return seqs, err
		},
		"onceflow.enqueue": func(src string) ([]int64, error) {
			var seqs []int64
			for i := range n { // one transaction each
				var seq int64
				if err := b.db.Pool.QueryRow(b.ctx, `SELECT seq FROM onceflow.enqueue($1, $2, 'x', '{}')`, topic(i), src).Scan(&seq); err != nil {
					return nil, err
				}
				seqs = append(seqs, seq)
			}
			return seqs, nil
		},
		"onceflow.enqueue_batch": func(src string) ([]int64, error) {
			events := make([]map[string]any, n)
			for i := range events {
				events[i] = map[string]any{"topic": topic(i), "source": src, "event_type": "x", "payload": map[string]any{}}
			}
			js, _ := json.Marshal(events)
			rows, err := b.db.Pool.Query(b.ctx, `SELECT seq FROM onceflow.enqueue_batch($1::jsonb)`, string(js))
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[int64])
		},
		"INSERT naming the seqs onceflow.next_seqs gave": func(src string) ([]int64, error) {
			var seqs []int64
			for i := range n {
				var seq int64
				if err := b.db.Pool.QueryRow(b.ctx, `WITH s AS (SELECT next_seq FROM onceflow.next_seqs(ARRAY[$2], ARRAY[$1]))
					INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload)
					SELECT gen_random_uuid()::text, $1, $2, s.next_seq, 'x', '\x7b7d' FROM s RETURNING seq`, topic(i), src).Scan(&seq); err != nil {
					return nil, err
				}
				seqs = append(seqs, seq)
			}
			return seqs, nil
		},
		"INSERT … SELECT naming no seq": func(src string) ([]int64, error) {
			rows, err := b.db.Pool.Query(b.ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload)
				SELECT gen_random_uuid()::text, CASE WHEN g % 2 = 0 THEN 'orders' ELSE 'emails' END, $1, 'x', '\x7b7d'
				  FROM generate_series(0, $2 - 1) g ORDER BY g
				RETURNING seq`, src, n)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[int64])
		},
		"COPY": func(src string) ([]int64, error) {
			var in strings.Builder
			for i := range n {
				fmt.Fprintf(&in, "copy-%s-%d\t%s\t%s\tx\t\\\\x7b7d\n", src, i, topic(i), src)
			}
			conn, err := b.db.Pool.Acquire(b.ctx)
			if err != nil {
				return nil, err
			}
			defer conn.Release()
			if _, err := conn.Conn().PgConn().CopyFrom(b.ctx, strings.NewReader(in.String()),
				`COPY onceflow.outbox (event_id, topic, source, event_type, payload) FROM STDIN`); err != nil {
				return nil, err
			}
			rows, err := b.db.Pool.Query(b.ctx, `SELECT seq FROM onceflow.outbox WHERE source = $1 ORDER BY event_id`, src)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowTo[int64])
		},
	}
	for way, run := range ways {
		src := "agg-" + strings.NewReplacer(" ", "-", "…", "", ".", "-").Replace(way)
		got, err := run(src)
		if err != nil {
			t.Errorf("%s: %v", way, err)
			continue
		}
		// Alternating topics: the i-th event is its topic's (i/2+1)-th.
		want := make([]int64, n)
		for i := range want {
			want[i] = int64(i/2 + 1)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: returned seqs %v, want %v", way, got, want)
		}
		per := b.streamSeqs(t, src)
		if len(per) != 2 || !oneToN(per["orders"], n/2) || !oneToN(per["emails"], n/2) {
			t.Errorf("%s: stored seqs in id order per topic %v, want 1..%d on each topic", way, per, n/2)
		}
	}
	var bad int
	if err := b.db.Pool.QueryRow(b.ctx, `SELECT count(*) FROM onceflow.source_seq s
		  JOIN (SELECT source, topic, max(seq) m FROM onceflow.outbox GROUP BY source, topic) o USING (source, topic)
		 WHERE greatest(s.last_seq, (SELECT max(m.last_seq) FROM onceflow.source_seq_moves m WHERE m.source = s.source AND m.topic = s.topic)) <> o.m`).Scan(&bad); err != nil || bad != 0 {
		t.Fatalf("%d streams whose counter is not their last seq (%v)", bad, err)
	}
}

// TestStreamSeqForgedRefused: a statement naming a seq that is not its
// stream's next (ahead, behind, repeated, or out of id order) is refused with
// SQLSTATE 23514 and stores nothing; the stream goes on from its counter.
func TestStreamSeqForgedRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 2 {
		if _, err := b.enqueue(t, outbox.Writer{}, msg("s")); err != nil { // seqs 1, 2
			t.Fatal(err)
		}
	}
	for what, q := range map[string]string{
		"ahead (999)":       `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('f1', 'orders', 's', 999, 'x', '\x7b7d')`,
		"behind (1)":        `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('f2', 'orders', 's', 1, 'x', '\x7b7d')`,
		"a gap (3 and 5)":   `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('f3', 'orders', 's', 3, 'x', '\x7b7d'), ('f4', 'orders', 's', 5, 'x', '\x7b7d')`,
		"out of id order":   `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('f5', 'orders', 's', 4, 'x', '\x7b7d'), ('f6', 'orders', 's', 3, 'x', '\x7b7d')`,
		"a new stream at 7": `INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, payload) VALUES ('f7', 'emails', 's', 7, 'x', '\x7b7d')`,
	} {
		_, err := b.db.Pool.Exec(b.ctx, q)
		var pe *pgconn.PgError
		switch {
		case what == "behind (1)" && errors.As(err, &pe) && pe.Code == "23505":
			// A seq the stream has: the unique key refuses it first.
		case !errors.As(err, &pe) || pe.Code != "23514" || !strings.Contains(pe.Message, "the stream's next seqs are"):
			t.Errorf("%s: %v, want SQLSTATE 23514 naming the stream's next seq", what, err)
		}
	}
	r, err := b.enqueue(t, outbox.Writer{}, msg("s"))
	if err != nil || r.Seq != 3 {
		t.Fatalf("after the refused statements: seq %d (%v), want 3", r.Seq, err)
	}
	if got := b.streamSeqs(t, "s"); len(got) != 1 || !oneToN(got["orders"], 3) {
		t.Fatalf("stored %v, want orders 1 2 3 only", got)
	}
}

// TestStreamSeqNotBurnt: a row that is not stored takes no seq: rolled back,
// or refused (a taken event id, a constraint) inside a savepoint. The next
// row gets the seq the lost one would have had.
func TestStreamSeqNotBurnt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.enqueue(t, outbox.Writer{}, msg("s")); err != nil { // seq 1, event id generated
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(b.ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload) VALUES ('taken', 'orders', 's', 'x', '\x7b7d')`); err != nil {
		t.Fatal(err)
	}
	// Rolled back.
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(b.ctx, tx, msg("s")); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(b.ctx)
	err = pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		// Refused: the event id is taken (since migration 034 by the key
		// table's trigger after the insert, so ON CONFLICT DO NOTHING no
		// longer skips it), in a savepoint that is rolled back.
		if _, err := tx.Exec(b.ctx, `SAVEPOINT a`); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload)
			VALUES ('taken', 'orders', 's', 'x', '\x7b7d')`); err == nil {
			return fmt.Errorf("a taken event id was stored")
		}
		if _, err := tx.Exec(b.ctx, `ROLLBACK TO SAVEPOINT a`); err != nil {
			return err
		}
		// Refused by a constraint, in a savepoint that is rolled back.
		if _, err := tx.Exec(b.ctx, `SAVEPOINT a`); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, `INSERT INTO onceflow.outbox (event_id, topic, source, event_type, payload) VALUES ('new', 'orders', 's', '', '\x7b7d')`); err == nil {
			return fmt.Errorf("an empty event_type was stored")
		}
		if _, err := tx.Exec(b.ctx, `ROLLBACK TO SAVEPOINT a`); err != nil {
			return err
		}
		_, err = outbox.Enqueue(b.ctx, tx, msg("s"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.streamSeqs(t, "s"); !oneToN(got["orders"], 3) {
		t.Fatalf("seqs %v, want 1 2 3", got)
	}
}

// TestStreamSeqIDOrder: a producer whose row drew its id before it waited
// for the stream's lock gets a new id after the wait, so that per stream id
// order is seq order (R2): the relay, reading in id order, never meets a
// stream's seq 3 before its seq 2.
func TestStreamSeqIDOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	t1, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer t1.Rollback(ctx) //nolint:errcheck
	// Seq 1; t1 holds the stream's counter.
	if _, err := outbox.Enqueue(ctx, t1, msg("s")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var pid uint32
	conn, err := b.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pid = conn.Conn().PgConn().PID()
	go func() {
		// Draws its id now, then waits for t1's lock.
		done <- pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, msg("s"))
			return err
		})
	}()
	received := false
	defer func() { // before conn is released
		if !received {
			_ = t1.Rollback(ctx)
			cancel()
			<-done
		}
	}()
	// Wait until the second producer is blocked on t1's lock.
	for {
		var waiting bool
		if err := b.db.Pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the second producer never waited for the stream's lock")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := outbox.Enqueue(ctx, t1, msg("s")); err != nil { // seq 2, a higher id than the waiter's first one
		t.Fatal(err)
	}
	if err := t1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	received = true
	if err != nil {
		t.Fatal(err)
	}
	if got := b.streamSeqs(t, "s"); !oneToN(got["orders"], 3) {
		t.Fatalf("seqs in id order %v, want 1 2 3", got)
	}
}
