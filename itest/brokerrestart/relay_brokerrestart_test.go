package brokerrestart

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

var errRollback = errors.New("rollback")

// TestRelayBrokerRestart restarts the (private) broker in the middle of a
// run while producers keep committing: the relay rides out the outage with
// backoff, recovers through its checkpoint, and the checker finds nothing
// lost, duplicated or reordered.
func TestRelayBrokerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a private Kafka")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	k := testkit.StartPrivateKafka(t)
	seed := kgo.SeedBrokers(k.Brokers)
	db := testkit.NewDB(t)

	adm := kadm.NewClient(testkit.Client(t, seed))
	topic, ckpt := "restart-events", "restart-ckpt"
	for name, cfg := range map[string]map[string]*string{topic: nil, ckpt: {"cleanup.policy": testkit.StringPtr("compact")}} {
		resp, err := adm.CreateTopic(ctx, 2, 1, cfg, name)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}

	relay := testkit.Start(t, "relay", testkit.Binary(t, "relay"), nil, "run",
		"-database-url", db.URL, "-kafka-brokers", k.Brokers, "-checkpoint-topic", ckpt,
		"-http-addr", "127.0.0.1:0", "-backoff-max", "1s")
	if _, err := relay.WaitFor(ctx, regexp.MustCompile(`"msg":"producer ready`)); err != nil {
		t.Fatal(err)
	}

	var committed atomic.Int64
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var werr error
	var werrOnce sync.Once
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for wctx.Err() == nil {
				var msgs []outbox.Message
				for range 1 + rng.IntN(4) {
					msgs = append(msgs, outbox.Message{Topic: topic, Source: fmt.Sprintf("s%d", rng.IntN(8)), EventType: "x", Payload: []byte(`{}`)})
				}
				rollback := rng.IntN(5) == 0
				err := pgx.BeginFunc(wctx, db.Pool, func(tx pgx.Tx) error {
					if _, err := outbox.EnqueueBatch(wctx, tx, msgs); err != nil {
						return err
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				switch {
				case err == nil:
					committed.Add(int64(len(msgs)))
				case errors.Is(err, errRollback), outbox.IsRetryable(err), wctx.Err() != nil:
				default:
					werrOnce.Do(func() { werr = err })
					return
				}
				time.Sleep(time.Millisecond) // pacing the writers, not synchronisation
			}
		}()
	}
	published := func() int {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox WHERE id NOT IN (SELECT id FROM onceflow.outbox_pending)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitPublished := func(n int) {
		for published() < n {
			if ctx.Err() != nil {
				t.Fatalf("fewer than %d published before the deadline:\n%s", n, relay.Output())
			}
			time.Sleep(20 * time.Millisecond) // polling a condition
		}
	}
	waitPublished(300)
	before := published()
	t0 := time.Now()
	if err := k.Restart(ctx); err != nil {
		t.Fatalf("restart broker: %v", err)
	}
	t.Logf("broker restarted in %s with %d rows published before", time.Since(t0).Round(time.Millisecond), before)
	waitPublished(before + 300)
	t.Logf("relay publishing again %s after the restart began", time.Since(t0).Round(time.Millisecond))
	stopWriters()
	wg.Wait()
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}
	rep, err := testkit.NewChecker(t, db.Pool, topic, seed).Check(ctx)
	if err != nil {
		t.Fatalf("checker: %v", err)
	}
	t.Logf("checker: %s (writers committed %d)", rep, committed.Load())
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if relay.Exited() {
		t.Fatalf("relay exited:\n%s", relay.Output())
	}
}
