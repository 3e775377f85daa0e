package inboxtest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/inboxtest"
)

type orderPlaced struct {
	OrderID string `json:"order_id"`
}

func createShipments(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE public.shipments (id bigserial PRIMARY KEY, order_id text NOT NULL)`)
	return err
}

// shipments counts the shipments of the order an event names.
func shipments(ctx context.Context, tx pgx.Tx, ev envelope.Envelope) (int, error) {
	var n int
	err := tx.QueryRow(ctx, `SELECT count(*) FROM public.shipments WHERE order_id = $1`, ev.Source).Scan(&n)
	return n, err
}

// execer is where a handler writes: its transaction, or (wrongly) the pool.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// noop writes nothing.
type noop struct{}

func (noop) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, nil
}

// router ships an order with a plain INSERT (no idempotence of its own:
// the inbox must make it once), writing through db(tx).
func router(db func(tx pgx.Tx) execer) *inbox.Router {
	r := inbox.NewRouter(nil)
	inbox.Route(r, "order.placed", func(ctx context.Context, tx pgx.Tx, ev inbox.TypedEvent[orderPlaced]) error {
		_, err := db(tx).Exec(ctx, `INSERT INTO public.shipments (order_id) VALUES ($1)`, ev.Value.OrderID)
		return err
	})
	return r
}

func harness(t *testing.T, h inbox.Handler) *inboxtest.Harness {
	return inboxtest.New(t, inboxtest.Config{DSN: testkit.DatabaseURL(t), Handler: h, Setup: createShipments})
}

func newOrder(h *inboxtest.Harness) func() envelope.Envelope {
	var n atomic.Int32
	return func() envelope.Envelope {
		id := fmt.Sprintf("order-%d", n.Add(1))
		return h.Event(id, "order.placed", orderPlaced{OrderID: id})
	}
}

// TestHarness: a correct handler passes the three redelivery tests; single
// events apply or are dead-lettered with the router's reason.
func TestHarness(t *testing.T) {
	t.Parallel()
	h := harness(t, router(func(tx pgx.Tx) execer { return tx }))
	h.CheckRedelivery(newOrder(h), shipments)

	ok := h.Event("order-x", "order.placed", orderPlaced{OrderID: "order-x"})
	unknown := h.Event("order-y", "order.refunded", orderPlaced{OrderID: "order-y"})
	if res := h.Apply(ok, unknown); res != (inbox.ApplyResult{Processed: 1, DeadLettered: 1}) {
		t.Fatalf("Apply: %+v", res)
	}
	h.AssertApplied(ok)
	h.AssertDeadLettered(unknown, `no handler for event type "order.refunded" (the router handles: order.placed)`)
}

// recorder is a testing.TB that records the failures a check reports
// instead of failing the test running it.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Errorf(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, a...))
}

func (r *recorder) Helper() {}

// TestCheckRedeliveryCatchesFaults: the checks fail a handler that writes
// outside its transaction (the crash test sees its effect survive) and one
// whose effect Effects cannot see (every check would pass vacuously).
func TestCheckRedeliveryCatchesFaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		db   func(h **inboxtest.Harness) func(pgx.Tx) execer
		want []string
	}{
		{"writes through the pool", func(h **inboxtest.Harness) func(pgx.Tx) execer {
			return func(pgx.Tx) execer { return (*h).Pool }
		}, []string{`"crash before the commit"`, "survived a crash before the commit: the handler writes outside the transaction it is given"}},
		{"no effect", func(**inboxtest.Harness) func(pgx.Tx) execer {
			return func(pgx.Tx) execer { return noop{} }
		}, []string{"after the first delivery: 0 effects", "made no effect", "after the race: 0 effects"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{TB: t}
			var h *inboxtest.Harness
			h = inboxtest.New(rec, inboxtest.Config{DSN: testkit.DatabaseURL(t), Handler: router(c.db(&h)), Setup: createShipments})
			h.CheckRedelivery(newOrder(h), shipments)
			got := strings.Join(rec.errs, "\n")
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("reported failures lack %q:\n%s", w, got)
				}
			}
			t.Logf("reported:\n%s", got)
		})
	}
}

// TestExample runs the package example's test body, so that the code the
// documentation shows works.
func TestExample(t *testing.T) {
	t.Setenv("DATABASE_URL", testkit.DatabaseURL(t))
	testShipper(t)
}
