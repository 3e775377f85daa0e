package orders_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestOrdersEndToEnd runs the example service as it would be deployed:
// the orders command enqueues into the orders database, the real relay
// binary publishes it to a 3-partition topic, the shipper command consumes
// it into the shipping database. Mid-run the orders process and then the
// shipper are SIGKILLed and restarted. In the end every order has exactly
// one shipment: none lost, none twice.
func TestOrdersEndToEnd(t *testing.T) {
	t.Parallel()
	testkit.SkipIfShort(t, "PostgreSQL and Kafka")
	const n = 300
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	start := time.Now()
	bin := testkit.Build(t, "./cmd/relay", "./examples/orders/cmd/...")
	built := time.Now()
	ordersDB, shipDB := testkit.NewDB(t), testkit.NewDB(t)
	brokers := testkit.KafkaBrokers(t)
	topic := testkit.Topic(t, "orders", 3, nil)
	ckpt := testkit.Topic(t, "orders-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})

	shipperArgs := []string{"-database-url", shipDB.URL, "-kafka-brokers", brokers, "-topic", topic,
		"-group", "shipper-" + topic, "-instance-id", "shipper-1"}
	ordersArgs := []string{"-database-url", ordersDB.URL, "-topic", topic, "-count", fmt.Sprint(n), "-interval", "3ms"}
	shipper := testkit.Start(t, "shipper", filepath.Join(bin, "shipper"), nil, shipperArgs...)
	testkit.Start(t, "relay", filepath.Join(bin, "relay"), nil, "run",
		"-database-url", ordersDB.URL, "-kafka-brokers", brokers, "-checkpoint-topic", ckpt,
		"-transactional-id-prefix", "example-"+topic+"-", "-http-addr", "127.0.0.1:0", "-log-level", "warn")
	producer := testkit.Start(t, "orders", filepath.Join(bin, "orders"), nil, ordersArgs...)

	// Kill the orders process a third of the way, and restart it: it
	// places the orders still missing.
	waitCount(ctx, t, ordersDB.Pool, `SELECT count(*) FROM public.orders`, n/3)
	producer.Kill()
	placedAtKill := count(ctx, t, ordersDB.Pool, `SELECT count(*) FROM public.orders`)
	producer = testkit.Start(t, "orders-2", filepath.Join(bin, "orders"), nil, ordersArgs...)

	// Kill the shipper once it has shipped a third, and restart it.
	waitCount(ctx, t, shipDB.Pool, `SELECT count(*) FROM public.shipments`, n/3)
	shipper.Kill()
	shippedAtKill := count(ctx, t, shipDB.Pool, `SELECT count(*) FROM public.shipments`)
	testkit.Start(t, "shipper-2", filepath.Join(bin, "shipper"), nil, shipperArgs...)

	if err := producer.Wait(60 * time.Second); err != nil {
		t.Fatalf("orders (restarted): %v\n%s", err, producer.Output())
	}
	waitCount(ctx, t, shipDB.Pool, `SELECT count(*) FROM public.shipments`, n)

	// Exactly once: the shipments' order ids are the orders, each once.
	placed := ids(ctx, t, ordersDB.Pool, `SELECT id FROM public.orders`)
	shipped := ids(ctx, t, shipDB.Pool, `SELECT order_id FROM public.shipments`)
	if len(placed) != n {
		t.Fatalf("%d orders placed, want %d", len(placed), n)
	}
	lost, twice := 0, 0
	for id := range placed {
		switch shipped[id] {
		case 0:
			lost++
		case 1:
		default:
			twice++
		}
	}
	if lost > 0 || twice > 0 || len(shipped) != n {
		t.Fatalf("of %d orders: %d without a shipment, %d shipped more than once, %d order ids shipped", n, lost, twice, len(shipped))
	}
	t.Logf("%d orders, %d shipments, each order once; orders killed after %d placed, shipper after %d shipped; build %s, run %s",
		n, n, placedAtKill, shippedAtKill, built.Sub(start).Round(time.Millisecond), time.Since(built).Round(time.Millisecond))
}

func count(ctx context.Context, t *testing.T, pool *pgxpool.Pool, query string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// waitCount waits until query counts at least want; it tolerates the
// table not existing yet (the commands create it at start).
func waitCount(ctx context.Context, t *testing.T, pool *pgxpool.Pool, query string, want int) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		err := pool.QueryRow(ctx, query).Scan(&n)
		if err == nil && n >= want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s to reach %d: got %d (%v): %v", query, want, n, err, ctx.Err())
		case <-tick.C:
		}
	}
}

// ids counts the rows of each id query returns.
func ids(ctx context.Context, t *testing.T, pool *pgxpool.Pool, query string) map[string]int {
	t.Helper()
	rows, err := pool.Query(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		m[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}
