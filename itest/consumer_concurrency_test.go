package itest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// slowServer is a downstream that takes delay per request and dedups by
// Idempotency-Key (the business logic runs once per key; a repeat, even one
// that arrives while the first is still running, gets the first's answer).
// It keeps, per source, the seqs in the order their business logic ran:
// a source whose seq 2 ran before its seq 1 shows up there even though the
// downstream dedups.
type slowServer struct {
	delay time.Duration
	// hold, when it returns a channel for a key, makes the request wait on
	// it (or until the client goes away) before anything else.
	hold func(key string) <-chan struct{}

	mu       sync.Mutex
	seen     map[string]int // key → requests
	business map[string]int // key → business logic runs
	order    map[string][]int64
	inFlight int
	maxIn    int
}

func newSlowServer(t *testing.T, delay time.Duration) (*slowServer, *httptest.Server) {
	s := &slowServer{delay: delay, seen: map[string]int{}, business: map[string]int{}, order: map[string][]int64{}}
	srv := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(srv.Close)
	return s, srv
}

func (s *slowServer) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	s.seen[key]++
	s.inFlight++
	s.maxIn = max(s.maxIn, s.inFlight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	if s.hold != nil {
		if ch := s.hold(key); ch != nil {
			select {
			case <-ch:
			case <-r.Context().Done():
				return
			}
		}
	}
	time.Sleep(s.delay)
	s.mu.Lock()
	if s.business[key] == 0 { // else: a repeat, answered as the first
		src := r.Header.Get("X-Onceflow-Source")
		seq, _ := strconv.ParseInt(r.Header.Get("X-Onceflow-Seq"), 10, 64)
		s.order[src] = append(s.order[src], seq)
		s.business[key]++
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"ok":true}`)
}

// check asserts that every event's key reached the business logic exactly
// once (a key never sent has none), and each source's business ran in seq
// order.
func (s *slowServer) check(t *testing.T, evs []envelope.Envelope) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs {
		if n := s.business["event:"+ev.EventID]; n != 1 {
			t.Errorf("event %s: business logic ran %d times, want 1", ev.EventID, n)
		}
	}
	for src, seqs := range s.order {
		for i := range seqs {
			if seqs[i] != int64(i+1) {
				t.Errorf("source %s: business in seq order %v, want 1, 2, …", src, seqs)
				break
			}
		}
	}
}

func slowHandlersFile(t *testing.T, url, timeout string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "handlers.json")
	body := fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "http", "http": {"url": %q, "timeout": %q}}]}`, url+"/effects", timeout)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// sourceEvents are seqs 1..perSource of n sources, source by source
// interleaved (seq 1 of every source, then seq 2, …).
func sourceEvents(prefix string, n, perSource int) []envelope.Envelope {
	var evs []envelope.Envelope
	for seq := 1; seq <= perSource; seq++ {
		for i := range n {
			evs = append(evs, testEvent(fmt.Sprintf("%s-%03d", prefix, i), int64(seq)))
		}
	}
	return evs
}

// busyBackends counts the consumer's backends (application_name app), and
// those of them idle in a transaction for more than age: a transaction held
// open while the client waits for something else (a downstream call). A
// transaction that is merely slow (a loaded machine) is busy, not idle.
func busyBackends(ctx context.Context, pool *pgxpool.Pool, app string, age time.Duration) (conns, oldTx int, err error) {
	err = pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'idle in transaction' AND state_change < now() - make_interval(secs => $2))
	  FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
	   AND application_name = $1`, app, age.Seconds()).Scan(&conns, &oldTx)
	return conns, oldTx, err
}

// TestConcurrentEffectsBoundedConnections: an http handler against a
// downstream that takes 1 s per call, 120 events of 40 sources on two
// partitions, Concurrency 20. The calls of different sources of a partition
// run at once (all done in a fraction of the 60 s they take one after
// another per partition), each source's in seq order, every key's business
// logic once, and the consumer never has more than 6 PostgreSQL connections
// nor a transaction held open (idle) across a call.
func TestConcurrentEffectsBoundedConnections(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	ctx := context.Background()
	srv, hs := newSlowServer(t, time.Second)
	topic := testkit.Topic(t, "conc", 2, nil)
	evs := sourceEvents("payer", 40, 3)
	h, err := handlerfile.Load(slowHandlersFile(t, hs.URL, "5s"))
	if err != nil {
		t.Fatal(err)
	}
	const app = "onceflow-concurrency-test"
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	produce(t, testkit.Client(t), topic, evs...)

	var maxConns, oldTx atomic.Int64
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampleCtx.Err() == nil {
			n, old, err := busyBackends(sampleCtx, db.Pool, app, 500*time.Millisecond)
			if err == nil {
				maxConns.Store(max(maxConns.Load(), int64(n)))
				oldTx.Store(max(oldTx.Load(), int64(old)))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	start := time.Now()
	startEngine(t, inbox.Config{Pool: pool, Group: "g-" + topic, Topics: []string{topic}, BatchHandler: h, Concurrency: 20,
		Logger: slog.New(slog.DiscardHandler)})
	eventually(t, 30*time.Second, "every event processed", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed'`)
		return n == len(evs), fmtState(n, " of ", len(evs))
	})
	took := time.Since(start)
	stopSampling()
	<-sampled
	srv.check(t, evs)
	if took > 30*time.Second {
		t.Errorf("took %s: the calls ran one after another (%s)", took, time.Duration(len(evs))*srv.delay)
	}
	if n := maxConns.Load(); n > 6 {
		t.Errorf("the consumer used up to %d PostgreSQL connections during the calls, want at most 6", n)
	}
	if n := oldTx.Load(); n > 0 {
		t.Errorf("up to %d of the consumer's transactions idle for more than 500 ms (across a 1 s call)", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.effects WHERE status = 'done' AND claimed_by IS NULL`); n != len(evs) {
		t.Errorf("%d done effects without a claim, want %d", n, len(evs))
	}
	srv.mu.Lock()
	t.Logf("%d events of 40 sources in %s (serially %s), up to %d calls in flight, up to %d PostgreSQL connections",
		len(evs), took.Round(time.Millisecond), time.Duration(len(evs))*srv.delay, srv.maxIn, maxConns.Load())
	srv.mu.Unlock()
}

// TestEffectCrashBetweenClaimAndRecord runs the consumer binary with the
// http handler; the downstream holds one event's request. While it is held,
// the consumer has no transaction open and the ledger shows the claim
// (intent, claimed by the consumer's instance, with a lease). The consumer
// is SIGKILLed there, between claim and record; restarted (same instance),
// it resumes at once with the same idempotency key, and the downstream ran
// the business logic of every key once.
func TestEffectCrashBetweenClaimAndRecord(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	ctx := context.Background()
	release := make(chan struct{})
	var held atomic.Bool
	srv, hs := newSlowServer(t, 0)
	srv.hold = func(key string) <-chan struct{} {
		if key == "event:held-002-1" {
			held.Store(true)
			return release
		}
		return nil
	}
	topic := testkit.Topic(t, "claimcrash", 1, nil)
	evs := sourceEvents("held", 5, 1)
	produce(t, testkit.Client(t), topic, evs...)
	bin := testkit.Binary(t, "consumer")
	const app = "onceflow-claimcrash-test"
	sep := "?"
	if strings.Contains(db.URL, "?") {
		sep = "&"
	}
	env := []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL + sep + "application_name=" + app,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + topic,
		"ONCEFLOW_TOPICS=" + topic,
		"ONCEFLOW_HANDLERS_FILE=" + slowHandlersFile(t, hs.URL, "5s"),
		"ONCEFLOW_HTTP_ADDR=",
		"ONCEFLOW_INSTANCE_ID=claimcrash",
		"ONCEFLOW_CONCURRENCY=4",
	}
	p := testkit.Start(t, "consumer-1", bin, env, "run")
	eventually(t, 60*time.Second, "the held request", func() (bool, string) { return held.Load(), "not yet" })
	// Held for a while: no transaction of the consumer's idles across it.
	time.Sleep(1500 * time.Millisecond)
	conns, oldTx, err := busyBackends(ctx, db.Pool, app, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if oldTx > 0 {
		t.Errorf("%d of the consumer's transactions open across the held call, want none", oldTx)
	}
	var status, owner string
	var attempts int
	var leased bool
	if err := db.Pool.QueryRow(ctx, `SELECT status, attempts, coalesce(claimed_by, ''), lease_until > now() FROM onceflow.effects
	   WHERE idempotency_key = 'event:held-002-1'`).Scan(&status, &attempts, &owner, &leased); err != nil {
		t.Fatalf("ledger row of the held call: %v", err)
	}
	if status != "intent" || attempts != 1 || !strings.Contains(owner, "claimcrash") || !leased {
		t.Errorf("ledger during the call: status %s, attempts %d, claimed by %q, lease running %v; want intent, 1, the instance, true", status, attempts, owner, leased)
	}
	p.Kill()
	_ = p.Wait(10 * time.Second)
	close(release)
	restarted := time.Now()
	p2 := testkit.Start(t, "consumer-2", bin, env, "run")
	eventually(t, 60*time.Second, "every event processed", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed'`)
		return n == len(evs), fmtState(n, " of ", len(evs))
	})
	resumed := time.Since(restarted)
	p2.Signal(syscall.SIGTERM)
	if err := p2.Wait(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p2.Output())
	}
	srv.check(t, evs)
	srv.mu.Lock()
	seen := srv.seen["event:held-002-1"]
	srv.mu.Unlock()
	if seen != 2 {
		t.Errorf("the held key was sent %d times, want 2 (before the crash and after, the same key)", seen)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.effects WHERE idempotency_key = 'event:held-002-1' AND status = 'done' AND attempts = 2`); n != 1 {
		t.Errorf("ledger row of the held key not done after 2 attempts")
	}
	t.Logf("%d connections of the consumer during the held call; resumed and finished %s after the restart", conns, resumed.Round(time.Millisecond))
}

// TestConcurrencyRebalanceAndKill: 240 events of 60 sources on 4
// partitions, an http handler taking 300 ms per call, Concurrency 2, batches
// of at most 20 records. Consumer A starts; B joins mid-run (a rebalance
// revokes partitions from A while its calls are in flight); A is SIGKILLed
// and restarted. Meanwhile the group's committed offsets are sampled: none
// is ever past an event that is not in the inbox. At the end every event is
// processed once, each source's business ran in seq order, every key's
// once, no gap was given up, and more calls were in flight at once than
// there are partitions.
func TestConcurrencyRebalanceAndKill(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	ctx := context.Background()
	srv, hs := newSlowServer(t, 300*time.Millisecond)
	topic := testkit.Topic(t, "concreb", 4, nil)
	group := "g-" + topic
	evs := sourceEvents("acct", 60, 4)
	cl := testkit.Client(t)
	recs := make([]*kgo.Record, len(evs))
	for i := range evs {
		recs[i] = evs[i].Record(topic)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// (partition, offset) → event id, to check the committed offsets.
	at := map[int32]map[int64]string{}
	for _, r := range recs {
		if at[r.Partition] == nil {
			at[r.Partition] = map[int64]string{}
		}
		for _, h := range r.Headers {
			if h.Key == envelope.HeaderEventID {
				at[r.Partition][r.Offset] = string(h.Value)
			}
		}
	}
	bin := testkit.Binary(t, "consumer")
	env := func(id string) []string {
		return []string{
			"ONCEFLOW_DATABASE_URL=" + db.URL,
			"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
			"ONCEFLOW_GROUP=" + group,
			"ONCEFLOW_TOPICS=" + topic,
			"ONCEFLOW_HANDLERS_FILE=" + slowHandlersFile(t, hs.URL, "5s"),
			"ONCEFLOW_HTTP_ADDR=",
			"ONCEFLOW_INSTANCE_ID=" + id,
			"ONCEFLOW_CONCURRENCY=2",
			"ONCEFLOW_BATCH_MAX_RECORDS=20",
		}
	}
	// The offset checker: a committed offset (Kafka's or the one stored in
	// PostgreSQL) never passes an event that is not applied.
	adm := kadm.NewClient(cl)
	checkCtx, stopChecking := context.WithCancel(ctx)
	checked := make(chan int)
	var violations sync.Map
	go func() {
		n := 0
		defer func() { checked <- n }()
		for checkCtx.Err() == nil {
			offs := map[int32]int64{}
			if got, err := adm.FetchOffsets(checkCtx, group); err == nil {
				got.Each(func(o kadm.OffsetResponse) {
					if o.Topic == topic && o.Err == nil {
						offs[o.Partition] = o.At
					}
				})
			}
			rows, err := db.Pool.Query(checkCtx, `SELECT kafka_partition, next_offset FROM onceflow.consumer_offsets WHERE group_id = $1 AND topic = $2`, group, topic)
			if err == nil {
				for rows.Next() {
					var p int32
					var o int64
					if rows.Scan(&p, &o) == nil {
						offs[p] = max(offs[p], o)
					}
				}
				rows.Close()
			}
			applied := map[string]bool{}
			rows, err = db.Pool.Query(checkCtx, `SELECT event_id FROM onceflow.inbox WHERE status = 'processed'`)
			if err != nil {
				continue
			}
			for rows.Next() {
				var id string
				if rows.Scan(&id) == nil {
					applied[id] = true
				}
			}
			rows.Close()
			for p, o := range offs {
				for off, id := range at[p] {
					if off < o && !applied[id] {
						violations.Store(fmt.Sprintf("partition %d committed at %d past unapplied offset %d (%s)", p, o, off, id), true)
					}
				}
			}
			n++
			time.Sleep(50 * time.Millisecond)
		}
	}()
	processed := func() int { return count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed'`) }
	a := testkit.Start(t, "consumer-a", bin, env("conc-a"), "run")
	eventually(t, 60*time.Second, "A under way", func() (bool, string) { n := processed(); return n >= 20, fmtState(n) })
	b := testkit.Start(t, "consumer-b", bin, env("conc-b"), "run")
	eventually(t, 60*time.Second, "B assigned", func() (bool, string) { return assignedLine.MatchString(b.Output()), "not yet" })
	atRebalance := processed()
	eventually(t, 60*time.Second, "more progress", func() (bool, string) { n := processed(); return n >= min(atRebalance+40, len(evs)), fmtState(n) })
	atKill := processed()
	a.Kill()
	_ = a.Wait(10 * time.Second)
	a2 := testkit.Start(t, "consumer-a2", bin, env("conc-a"), "run")
	eventually(t, 90*time.Second, "every event processed", func() (bool, string) {
		n := processed()
		return n == len(evs), fmtState(n, " of ", len(evs))
	})
	stopChecking()
	samples := <-checked
	for _, p := range []*testkit.Proc{a2, b} {
		p.Signal(syscall.SIGTERM)
		if err := p.Wait(30 * time.Second); err != nil {
			t.Errorf("SIGTERM: %v\n%s", err, p.Output())
		}
	}
	violations.Range(func(k, _ any) bool {
		t.Error(k)
		return true
	})
	srv.check(t, evs)
	if n := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`); n != 0 {
		t.Errorf("%d gaps given up, want 0", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox`); n != len(evs) {
		t.Errorf("%d inbox rows, want %d", n, len(evs))
	}
	srv.mu.Lock()
	if srv.maxIn <= 4 {
		t.Errorf("at most %d calls in flight over 4 partitions: the streams of a partition were not handled concurrently", srv.maxIn)
	}
	requests := 0
	for _, n := range srv.seen {
		requests += n
	}
	t.Logf("%d events; B joined at %d applied, A killed at %d; %d requests (%d resent), up to %d in flight; %d offset samples",
		len(evs), atRebalance, atKill, requests, requests-len(evs), srv.maxIn, samples)
	srv.mu.Unlock()
}
