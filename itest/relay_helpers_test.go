package itest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

var (
	reLeader = regexp.MustCompile(`"msg":"leadership acquired"`)
	reReady  = regexp.MustCompile(`"msg":"producer ready, recovered from checkpoint"`)
)

// relayEnv is one relay test's database, topic and relay settings.
type relayEnv struct {
	t          *testing.T
	db         *testkit.DB
	topic      string
	checkpoint string
	txnPrefix  string
	partitions int32
}

func newRelayEnv(t *testing.T, partitions int32) *relayEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	db := testkit.NewDB(t)
	topic := testkit.Topic(t, "relay", partitions, nil)
	ckpt := testkit.Topic(t, "relay-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	return &relayEnv{t: t, db: db, topic: topic, checkpoint: ckpt, txnPrefix: "it-" + topic + "-", partitions: partitions}
}

// start runs the relay binary. args override the defaults.
func (e *relayEnv) start(name string, env []string, args ...string) *testkit.Proc {
	e.t.Helper()
	bin := testkit.Binary(e.t, "relay")
	base := []string{"run",
		"-database-url", e.db.URL,
		"-kafka-brokers", testkit.KafkaBrokers(e.t),
		"-checkpoint-topic", e.checkpoint,
		"-transactional-id-prefix", e.txnPrefix,
		"-http-addr", "127.0.0.1:0",
		"-log-level", "info",
	}
	return testkit.Start(e.t, name, bin, env, append(base, args...)...)
}

// enqueue commits one event for source in its own transaction.
func (e *relayEnv) enqueue(ctx context.Context, source string) outbox.Result {
	e.t.Helper()
	var res outbox.Result
	err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = outbox.Enqueue(ctx, tx, outbox.Message{Topic: e.topic, Source: source, EventType: "test.event", Payload: []byte(`{}`)})
		return err
	})
	if err != nil {
		e.t.Fatalf("enqueue: %v", err)
	}
	return res
}

func (e *relayEnv) check(ctx context.Context) testkit.Report {
	e.t.Helper()
	ck := testkit.NewChecker(e.t, e.db.Pool, e.topic)
	rep, err := ck.Check(ctx)
	if err != nil {
		e.t.Fatalf("checker: %v (so far %s)", err, rep)
	}
	e.t.Logf("checker: %s", rep)
	if err := rep.Err(); err != nil {
		e.t.Fatal(err)
	}
	return rep
}

// writerPool opens a pool for the writers whose sessions detect deadlocks
// after 20ms instead of PostgreSQL's default 1s: the randomized writers
// deadlock on purpose, and each detection would otherwise stall them.
func writerPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["deadlock_timeout"] = "20ms"
	pc.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// writers runs n concurrent producers over sources until stop is called.
// Each transaction enqueues 1..maxTx events for random sources, one in ten
// stays open up to 50ms longer, and it rolls back with probability rollback. Rolled-back event ids are recorded so the
// test can assert none is published.
type writers struct {
	extras     writerExtras
	committed  atomic.Int64
	rolledBack sync.Map // event id -> struct{}
	retries    atomic.Int64
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	errMu      sync.Mutex
	err        error
}

func startWriters(ctx context.Context, pool *pgxpool.Pool, topic string, n, sources, maxTx int, rollback float64, limit int64) *writers {
	return startWritersWith(ctx, pool, topic, n, sources, maxTx, rollback, limit, writerExtras{})
}

// writerExtras are what some tests add to every writer transaction.
type writerExtras struct {
	// IDPrefix prefixes every event id (a generated UUID follows), so that
	// a checker can tell one database's events from another's on a shared
	// topic.
	IDPrefix string
	// CommittedTable, when set, gets one row (event_id) per event in the
	// event's own transaction: a record of what committed that does not
	// depend on the outbox (which -delete-on-publish empties).
	CommittedTable string
	// Also are more topics: each event goes to the writers' topic or to
	// one of these, drawn at random, so a transaction may span topics.
	Also []string
}

func startWritersWith(ctx context.Context, pool *pgxpool.Pool, topic string, n, sources, maxTx int, rollback float64, limit int64, extras writerExtras) *writers {
	ctx, cancel := context.WithCancel(ctx)
	w := &writers{cancel: cancel, extras: extras}
	for i := range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil && (limit <= 0 || w.committed.Load() < limit) {
				if err := w.oneTx(ctx, pool, topic, rng, sources, maxTx, rollback); err != nil && ctx.Err() == nil {
					w.errMu.Lock()
					if w.err == nil {
						w.err = err
					}
					w.errMu.Unlock()
					return
				}
			}
		}()
	}
	return w
}

// waitCommitted waits until the writers have committed at least n events:
// the crash tests stop their writers only once enough ran, however slow the
// machine, instead of after a fixed time.
func (w *writers) waitCommitted(t testing.TB, ctx context.Context, n int64) {
	t.Helper()
	for w.committed.Load() < n {
		if ctx.Err() != nil {
			t.Fatalf("the writers committed %d events, want %d before stopping them", w.committed.Load(), n)
		}
		time.Sleep(20 * time.Millisecond) // polling a counter
	}
}

var errRollback = errors.New("test rollback")

func (w *writers) oneTx(ctx context.Context, pool *pgxpool.Pool, topic string, rng *rand.Rand, sources, maxTx int, rollback float64) error {
	k := 1 + rng.IntN(maxTx)
	msgs := make([]outbox.Message, k)
	for j := range msgs {
		to := topic
		if n := len(w.extras.Also); n > 0 {
			if i := rng.IntN(n + 1); i < n {
				to = w.extras.Also[i]
			}
		}
		msgs[j] = outbox.Message{
			Topic:     to,
			Source:    fmt.Sprintf("src-%03d", rng.IntN(sources)),
			EventType: "test.event",
			Payload:   []byte(`{"n":1}`),
		}
		if w.extras.IDPrefix != "" {
			msgs[j].EventID = fmt.Sprintf("%s%016x%016x", w.extras.IDPrefix, rng.Uint64(), rng.Uint64())
		}
	}
	doRollback := rng.Float64() < rollback
	batch := rng.IntN(2) == 0
	var hold time.Duration
	if rng.IntN(10) == 0 {
		hold = time.Duration(rng.IntN(50)) * time.Millisecond
	}
	for attempt := 0; ; attempt++ {
		var ids []string
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			ids = ids[:0]
			if batch {
				res, err := outbox.EnqueueBatch(ctx, tx, msgs)
				if err != nil {
					return err
				}
				for _, r := range res {
					ids = append(ids, r.EventID)
				}
			} else {
				// One at a time in random order: may deadlock with
				// another writer, which is retryable (40P01).
				for _, m := range msgs {
					r, err := outbox.Enqueue(ctx, tx, m)
					if err != nil {
						return err
					}
					ids = append(ids, r.EventID)
				}
			}
			if t := w.extras.CommittedTable; t != "" {
				if _, err := tx.Exec(ctx, `INSERT INTO `+t+` (event_id) SELECT unnest($1::text[])`, ids); err != nil {
					return err
				}
			}
			if hold > 0 {
				// A long transaction: its rows (lower ids) become visible
				// after later ones commit, the late-committer case.
				time.Sleep(hold) // simulated work, not synchronisation
			}
			if doRollback {
				return errRollback
			}
			return nil
		})
		switch {
		case errors.Is(err, errRollback):
			for _, id := range ids {
				w.rolledBack.Store(id, struct{}{})
			}
			return nil
		case err == nil:
			w.committed.Add(int64(len(ids)))
			return nil
		case outbox.IsRetryable(err) && attempt < 20:
			w.retries.Add(1)
			continue
		default:
			return err
		}
	}
}

// stop ends the writers and returns their first error.
func (w *writers) stop() error {
	w.cancel()
	w.wg.Wait()
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

func (w *writers) wait() error {
	w.wg.Wait()
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

// assertNoRolledBack checks that no rolled-back event id reached the checker.
func assertNoRolledBack(t *testing.T, w *writers, ck *testkit.Checker) {
	t.Helper()
	var bad []string
	n := 0
	w.rolledBack.Range(func(k, _ any) bool {
		n++
		if ck.Count(k.(string)) > 0 {
			bad = append(bad, k.(string))
		}
		return true
	})
	if len(bad) > 0 {
		t.Fatalf("%d rolled-back events were published: %s", len(bad), strings.Join(bad[:min(5, len(bad))], ", "))
	}
	t.Logf("%d rolled-back events, none published", n)
}

func waitLeader(t *testing.T, ctx context.Context, p *testkit.Proc) {
	t.Helper()
	if _, err := p.WaitFor(ctx, reLeader); err != nil {
		t.Fatal(err)
	}
}

// insertPastConstraint runs insert in tx with the outbox's CHECK constraint
// name lifted, and puts the constraint back NOT VALID: a row as an old
// producer (before migration 018) or a superuser's hand could have stored.
func insertPastConstraint(ctx context.Context, tx pgx.Tx, name, insert string, args ...any) error {
	var def string
	if err := tx.QueryRow(ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conrelid = 'onceflow.outbox'::regclass AND conname = $1`, name).Scan(&def); err != nil {
		return fmt.Errorf("constraint %s: %w", name, err)
	}
	if _, err := tx.Exec(ctx, `ALTER TABLE onceflow.outbox DROP CONSTRAINT `+pgx.Identifier{name}.Sanitize()); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, insert, args...); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `ALTER TABLE onceflow.outbox ADD CONSTRAINT `+pgx.Identifier{name}.Sanitize()+` `+def+` NOT VALID`)
	return err
}
