package outbox_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestEnqueueCallsNoReplannedFunction: every function an enqueue calls
// (through Go Enqueue, EnqueueBatch, SQL onceflow.enqueue and
// onceflow.enqueue_batch) keeps its plans for the session. A LANGUAGE sql
// function that PostgreSQL cannot inline (it has a SET clause, as every
// onceflow function does, or SECURITY DEFINER) is planned again at each
// call: onceflow.source_refusal was one, asked once per stream, and cost
// 0.25 ms of CPU per call, more than the rest of a one-event enqueue's
// functions together (migration 030 made it PL/pgSQL). The functions are
// found by calling them, with track_functions on: a new one on the path is
// checked without a list to keep.
func TestEnqueueCallsNoReplannedFunction(t *testing.T) {
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
	var w outbox.Writer
	if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := w.Enqueue(ctx, tx, msg("plans-go")); err != nil {
			return err
		}
		if _, err := w.EnqueueBatch(ctx, tx, []outbox.Message{msg("plans-batch-a"), msg("plans-batch-b")}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT onceflow.enqueue('orders', 'plans-sql', 'order.created', '{"n":1}')`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT onceflow.enqueue_batch('[{"topic":"orders","source":"plans-sqlb","event_type":"order.created","payload":{"n":1}}]'::jsonb)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `
		SELECT p.oid::regprocedure::text, l.lanname, p.prosecdef OR p.proconfig IS NOT NULL
		  FROM pg_stat_user_functions s
		  JOIN pg_proc p ON p.oid = s.funcid
		  JOIN pg_language l ON l.oid = p.prolang
		 WHERE p.pronamespace = 'onceflow'::regnamespace
		 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	called, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn struct {
		name, lang string
		opaque     bool
	}, err error) {
		err = r.Scan(&fn.name, &fn.lang, &fn.opaque)
		return fn, err
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, fn := range called {
		seen[fn.name] = true
		if fn.lang == "sql" && fn.opaque {
			t.Errorf("%s: a LANGUAGE sql function with a SET clause or SECURITY DEFINER is called on the enqueue path: it is planned again at every call (write it in PL/pgSQL)", fn.name)
		}
	}
	// The check is only as good as what it saw: the counter functions and
	// the ownership check must have been among the calls.
	for _, want := range []string{"onceflow.next_seqs(text[],text[])", "onceflow.source_refusal(text,text)"} {
		if !seen[want] {
			t.Errorf("%s was not among the functions the enqueues called (%d seen): the check saw nothing", want, len(called))
		}
	}
}
