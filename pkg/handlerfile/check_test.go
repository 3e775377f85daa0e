package handlerfile

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestCheckFindsStatementsTheDatabaseRefuses: a missing table, a missing
// column and a type mismatch are each named with their event type; a good
// statement and a log handler pass; nothing is written or left prepared.
func TestCheckFindsStatementsTheDatabaseRefuses(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.shipments (id text PRIMARY KEY, n integer)`); err != nil {
		t.Fatal(err)
	}
	h, err := Parse([]byte(`{"handlers": [
	  {"event_type": "ok", "kind": "sql", "sql": "INSERT INTO public.shipments (id, n) VALUES (:event_id, :payload.n)"},
	  {"event_type": "no.table", "kind": "sql", "sql": "INSERT INTO public.shipmentz (id) VALUES (:event_id)"},
	  {"event_type": "no.column", "kind": "sql", "sql": "UPDATE public.shipments SET m = :payload.n WHERE id = :event_id"},
	  {"event_type": "bad.type", "kind": "sql", "sql": "INSERT INTO public.shipments (id, n) VALUES (:event_id, now())"},
	  {"event_type": "quiet", "kind": "log"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Check(ctx, h, db.Pool)
	var ce *CheckError
	if !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Fatalf("Check = %+v, %v; want 3 problems", res, err)
	}
	for i, want := range []string{
		`event_type "bad.type": column "n" is of type integer but expression is of type timestamp with time zone`,
		`event_type "no.column": column "m" of relation "shipments" does not exist`,
		`event_type "no.table": relation "public.shipmentz" does not exist`,
	} {
		if !strings.HasPrefix(ce.Problems[i], want) {
			t.Errorf("problem %d = %q, want it to start with %q", i, ce.Problems[i], want)
		}
	}
	if res.Handlers != 5 || res.Statements != 1 {
		t.Errorf("result %+v, want 5 handlers and 1 statement prepared", res)
	}
	var rows, prepared int
	if err := db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM public.shipments), (SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'INSERT INTO public.shipment%' OR statement LIKE 'UPDATE public.shipments%')`).Scan(&rows, &prepared); err != nil {
		t.Fatal(err)
	}
	if rows != 0 || prepared != 0 {
		t.Errorf("after Check: %d rows, %d prepared statements; want none", rows, prepared)
	}

	good, err := Parse([]byte(`{"handlers": [{"event_type": "*", "kind": "sql", "sql": "INSERT INTO public.shipments (id) VALUES (:event_id)"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := Check(ctx, good, db.Pool); err != nil || res.Statements != 1 {
		t.Fatalf("a good file: Check = %+v, %v", res, err)
	}
}
