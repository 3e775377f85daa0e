package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
)

type shipOrder struct {
	OrderID string  `json:"order_id"`
	Total   float64 `json:"total"`
}

// typedRecord is event id of source "src-"+id at seq 1, at offset.
func typedRecord(id string, offset int64, eventType, payload string) *kgo.Record {
	ev := envelope.Envelope{EventID: id, Source: "src-" + id, Seq: 1, EventType: eventType, Payload: []byte(payload)}
	r := ev.Record("orders")
	r.Offset = offset
	return r
}

// TestRouter drives a Router through an Applier against PostgreSQL: a known
// type reaches its typed handler decoded and commits its write; an unknown
// type and a payload that does not decode are dead-lettered on the first
// try (RetryMaxAttempts is 3) with a reason naming the type, the known
// types, the Go type and the field; the events after them still apply
// (each event has a source of its own: a dead letter is a missing seq of
// its source).
func TestRouter(t *testing.T) {
	t.Parallel()
	testkit.SkipIfShort(t, "PostgreSQL")
	ctx := context.Background()
	db := testkit.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.shipments (order_id text PRIMARY KEY, total float8)`); err != nil {
		t.Fatal(err)
	}
	r := inbox.NewRouter(nil)
	inbox.Route(r, "order.placed", func(ctx context.Context, tx pgx.Tx, ev inbox.TypedEvent[shipOrder]) error {
		_, err := tx.Exec(ctx, `INSERT INTO public.shipments VALUES ($1, $2)`, ev.Value.OrderID, ev.Value.Total)
		return err
	})
	inbox.Route(r, "order.cancelled", func(context.Context, pgx.Tx, inbox.TypedEvent[struct{}]) error { return nil })
	a, err := inbox.NewApplier(inbox.Config{Pool: db.Pool, Group: "g", Handler: r,
		RetryMaxAttempts: 3, RetryInitialInterval: time.Millisecond, RetryMaxInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.Apply(ctx,
		typedRecord("e1", 0, "order.placed", `{"order_id":"o-1","total":12.5}`),
		typedRecord("e2", 1, "order.shipped", `{}`),
		typedRecord("e3", 2, "order.placed", `{"order_id":"o-3","total":"lots"}`),
		typedRecord("e4", 3, "order.placed", `{"order_id":"o-4","total":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if res != (inbox.ApplyResult{Processed: 2, DeadLettered: 2}) {
		t.Fatalf("Apply: %+v, want 2 processed and 2 dead-lettered", res)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM public.shipments WHERE order_id IN ('o-1', 'o-4')`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("shipments o-1 and o-4: %d (%v)", n, err)
	}
	dead, err := inbox.ListDeadLetters(ctx, db.Pool, inbox.DefaultConsumerName, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"e2": {`no handler for event type "order.shipped"`, "the router handles: order.cancelled, order.placed"},
		"e3": {`event type "order.placed"`, "inbox_test.shipOrder", "shipOrder.total", "of type float64"},
	}
	if len(dead) != len(want) {
		t.Fatalf("dead letters %+v, want e2 and e3", dead)
	}
	for _, d := range dead {
		for _, s := range want[d.EventID] {
			if !strings.Contains(d.LastError, s) {
				t.Errorf("dead letter %s: reason %q lacks %q", d.EventID, d.LastError, s)
			}
		}
		if d.Attempts != 1 {
			t.Errorf("dead letter %s: %d attempts, want 1 (no retries for an event that can never apply)", d.EventID, d.Attempts)
		}
		t.Logf("dead letter %s: %s", d.EventID, d.LastError)
	}
}

// TestRouterUnknownTypeError: the error wraps ErrUnknownEventType; Route
// refuses a second handler for a type.
func TestRouterUnknownTypeError(t *testing.T) {
	t.Parallel()
	r := inbox.NewRouter(nil)
	err := r.Handle(context.Background(), nil, inbox.Event{Envelope: envelope.Envelope{EventType: "x"}})
	if !errors.Is(err, inbox.ErrUnknownEventType) {
		t.Fatalf("got %v, want ErrUnknownEventType", err)
	}
	inbox.Route(r, "x", func(context.Context, pgx.Tx, inbox.TypedEvent[int]) error { return nil })
	defer func() {
		if recover() == nil {
			t.Fatal("a second Route for one type did not panic")
		}
	}()
	inbox.Route(r, "x", func(context.Context, pgx.Tx, inbox.TypedEvent[int]) error { return nil })
}

// TestApplierRetriesThenDeadLetters: a handler error that is not Permanent
// is retried up to RetryMaxAttempts, then dead-lettered; a redelivery of an
// applied event is a duplicate.
func TestApplierRetriesThenDeadLetters(t *testing.T) {
	t.Parallel()
	testkit.SkipIfShort(t, "PostgreSQL")
	ctx := context.Background()
	db := testkit.NewDB(t)
	calls := 0
	a, err := inbox.NewApplier(inbox.Config{Pool: db.Pool, Group: "g",
		Handler: inbox.HandlerFunc(func(_ context.Context, _ pgx.Tx, ev inbox.Event) error {
			calls++
			if ev.EventID == "bad" {
				return errors.New("flaky downstream")
			}
			return nil
		}),
		RetryMaxAttempts: 3, RetryInitialInterval: time.Millisecond, RetryMaxInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	good := typedRecord("good", 0, "t", `{}`)
	if res, err := a.Apply(ctx, good, typedRecord("bad", 1, "t", `{}`)); err != nil || res != (inbox.ApplyResult{Processed: 1, DeadLettered: 1}) {
		t.Fatalf("Apply: %+v, %v", res, err)
	}
	if res, err := a.Apply(ctx, good); err != nil || res != (inbox.ApplyResult{Duplicates: 1}) {
		t.Fatalf("redelivery: %+v, %v", res, err)
	}
	// The batch try (good, bad), good alone, then bad's 3 tries.
	if calls != 6 {
		t.Fatalf("handler calls %d, want 6", calls)
	}
	if _, err := inbox.NewApplier(inbox.Config{Pool: db.Pool, Handler: inbox.HandlerFunc(nil)}); err == nil || !strings.Contains(err.Error(), "Group") {
		t.Fatalf("NewApplier without Group: %v", err)
	}
}

// TestApplierConnectionLostIsNotTheEventsFault: a handler whose connection
// dies mid-event (as when PostgreSQL or the network drops it), twice, gets
// an infrastructure error back each time, never a retry or a dead letter
// for the event (RetryMaxAttempts is 1); the next delivery applies it.
func TestApplierConnectionLostIsNotTheEventsFault(t *testing.T) {
	t.Parallel()
	testkit.SkipIfShort(t, "PostgreSQL")
	ctx := context.Background()
	db := testkit.NewDB(t)
	cuts := 2
	a, err := inbox.NewApplier(inbox.Config{Pool: db.Pool, Group: "g",
		Handler: inbox.HandlerFunc(func(ctx context.Context, tx pgx.Tx, _ inbox.Event) error {
			if cuts > 0 {
				cuts--
				_ = tx.Conn().Close(ctx)
				return errors.New("conn closed")
			}
			return nil
		}),
		RetryMaxAttempts: 1, RetryInitialInterval: time.Millisecond, RetryMaxInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := typedRecord("e1", 0, "t", `{}`)
	for i := range 2 {
		res, err := a.Apply(ctx, r)
		var he *inbox.HandlerError
		if err == nil || errors.As(err, &he) {
			t.Fatalf("Apply #%d with the connection cut: %+v, %v; want an infrastructure error (no *HandlerError)", i+1, res, err)
		}
	}
	if res, err := a.Apply(ctx, r); err != nil || res != (inbox.ApplyResult{Processed: 1}) {
		t.Fatalf("redelivery: %+v, %v; want it applied", res, err)
	}
}

// effecter makes its "effect" before the transaction (Effecter) and checks
// in the handler that the event arrives prepared.
type effecter struct{ effects, prepared int }

type noteEffect struct{}

func (noteEffect) Abandon(context.Context, *pgxpool.Pool) error { return nil }

func (e *effecter) Effect(context.Context, *pgxpool.Pool, inbox.Event) (inbox.Prepared, error) {
	e.effects++
	return noteEffect{}, nil
}

func (e *effecter) Handle(_ context.Context, _ pgx.Tx, ev inbox.Event) error {
	if p := ev.Prepared(); p != nil && p.Err == nil {
		e.prepared++
	}
	return nil
}

// TestApplierRunsEffecter: an Applier makes an Effecter handler's effects
// before the transaction, as a partition worker does, and the handler sees
// them; a redelivery makes none.
func TestApplierRunsEffecter(t *testing.T) {
	t.Parallel()
	testkit.SkipIfShort(t, "PostgreSQL")
	ctx := context.Background()
	db := testkit.NewDB(t)
	h := &effecter{}
	a, err := inbox.NewApplier(inbox.Config{Pool: db.Pool, Group: "g", Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := typedRecord("e1", 0, "t", `{}`), typedRecord("e2", 1, "t", `{}`)
	for range 2 {
		if _, err := a.Apply(ctx, r1, r2); err != nil {
			t.Fatal(err)
		}
	}
	if h.effects != 2 || h.prepared != 2 {
		t.Fatalf("effects %d, handler saw %d prepared; want 2 and 2", h.effects, h.prepared)
	}
}
