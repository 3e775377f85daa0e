package itest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/failpoint"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	relayadmin "github.com/onceflow/onceflow/pkg/relay/admin"
)

var (
	reReadyMarked = regexp.MustCompile(`"msg":"producer ready, recovered from checkpoint".*"marked":(\d+)`)
	reFenced      = regexp.MustCompile(`"msg":"publish batch[^"]*".*(PRODUCER_FENCED|INVALID_PRODUCER_EPOCH)`)
)

// startDefaultRelay runs the relay binary against db with default flags:
// no -transactional-id-prefix, no -shard. Only the checkpoint topic is set
// (shared by the caller's relays) and the lease is fast.
func startDefaultRelay(t *testing.T, name string, db *testkit.DB, ckpt string, env []string, args ...string) *testkit.Proc {
	t.Helper()
	base := []string{"run",
		"-database-url", db.URL,
		"-kafka-brokers", testkit.KafkaBrokers(t),
		"-checkpoint-topic", ckpt,
		"-http-addr", "127.0.0.1:0",
	}
	base = append(base, fastLease...)
	return testkit.Start(t, name, testkit.Binary(t, "relay"), env, append(base, args...)...)
}

// TestRelayTwoDatabasesShareKafka is two services deployed the usual way:
// each with its own database and outbox, one Kafka cluster, the relay image
// with default flags. Both write the same topic names (one events topic, the
// default shard, the same sources) and share the checkpoint topic. Each
// relay is SIGKILLed at least 10 times (two of them right after a Kafka
// commit, before the mark) while writers commit and roll back. Per database,
// the checker (reading only that database's events, told apart by an event
// id prefix) must find every committed event exactly once and every source
// in order.
//
// Before database identities, both relays used transactional.id
// onceflow-relay-default and checkpoint key "default", and recovery marked
// the other database's ids as published: committed events were lost.
func TestRelayTwoDatabasesShareKafka(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	topic := testkit.Topic(t, "shared", 3, nil)
	ckpt := testkit.Topic(t, "shared-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	type side struct {
		name string
		db   *testkit.DB
		w    *writers
	}
	// The writers of both databases commit while both relays are killed
	// again and again.
	sides := []*side{{name: "db1"}, {name: "db2"}}
	for _, s := range sides {
		s.db = testkit.NewDB(t)
		s.w = startWritersWith(ctx, writerPool(t, s.db.URL), topic, 2, 12, 4, 0.2, 0, writerExtras{IDPrefix: s.name + ":"})
	}
	const kills = 12
	var wg sync.WaitGroup
	errs := make(chan error, len(sides))
	start := time.Now()
	for i, s := range sides {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for k := range kills {
				var env []string
				if k == 3 || k == 8 {
					env = []string{"ONCEFLOW_FAILPOINTS=" + failpoint.RelayAfterKafkaCommit + "=2"}
				}
				p := startDefaultRelay(t, fmt.Sprintf("%s-relay-%d", s.name, k), s.db, ckpt, env, "-holder-id", s.name)
				if env != nil {
					select {
					case <-p.Done():
					case <-ctx.Done():
						errs <- fmt.Errorf("%s: relay with a failpoint did not die", s.name)
						return
					}
					if !strings.Contains(p.Output(), "failpoint "+failpoint.RelayAfterKafkaCommit) {
						errs <- fmt.Errorf("%s: relay exited without hitting its failpoint:\n%s", s.name, p.Output())
						return
					}
					continue
				}
				if _, err := p.WaitFor(ctx, reReady); err != nil {
					errs <- fmt.Errorf("%s: %w\n%s", s.name, err, p.Output())
					return
				}
				time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond) // the random kill moment, not a synchronisation
				p.Kill()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d SIGKILLs per relay (2 right after a Kafka commit) in %s", kills, time.Since(start).Round(time.Millisecond))
	for _, s := range sides {
		s.w.waitCommitted(t, ctx, 300)
		if err := s.w.stop(); err != nil {
			t.Fatalf("%s writer: %v", s.name, err)
		}
	}
	// Drain one database after the other, each final relay stopped with
	// SIGTERM (which ends its transaction) before the next starts. Relays
	// sharing a transactional.id, as before identities, would otherwise
	// only fence each other, and the loss this test is about would show as
	// a stall; and a relay killed in the middle of a transaction holds back
	// every read_committed reader of the shared topic until its next start
	// (or the transaction timeout) ends it.
	for _, s := range sides {
		p := startDefaultRelay(t, s.name+"-relay-final", s.db, ckpt, nil, "-holder-id", s.name)
		if _, err := p.WaitFor(ctx, reReady); err != nil {
			t.Fatal(err)
		}
		if err := testkit.WaitDrained(ctx, s.db.Pool, topic); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		p.Signal(syscall.SIGTERM)
		if err := p.Wait(30 * time.Second); err != nil {
			t.Fatalf("%s final relay: %v", s.name, err)
		}
	}
	identities := map[string]bool{}
	for _, s := range sides {
		id, err := relayadmin.ReadIdentity(ctx, s.db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		identities[id.ID] = true
		prefix := s.name + ":"
		ck := testkit.NewChecker(t, s.db.Pool, topic).Only(func(e envelope.Envelope) bool { return strings.HasPrefix(e.EventID, prefix) })
		rep, err := ck.Check(ctx)
		if err != nil {
			t.Fatalf("%s checker: %v (so far %s)", s.name, err, rep)
		}
		t.Logf("%s: %s (%d deadlock retries); identity %s", s.name, rep, s.w.retries.Load(), id.ID)
		if err := rep.Err(); err != nil {
			t.Errorf("%s: %v", s.name, err)
		}
		if rep.Committed < 300 {
			t.Errorf("%s: only %d events committed: the writers did not run during the kills", s.name, rep.Committed)
		}
		assertNoRolledBack(t, s.w, ck)
	}
	if len(identities) != 2 {
		t.Fatalf("the two databases share an identity: %v", identities)
	}
}

// TestRelayZombieFenced: leader A freezes (SIGSTOP by a failpoint) after its
// last lease check, with a transaction open and its records produced, right
// before it asks Kafka to commit. Standby B takes the lease over, initialises
// the same transactional.id (which aborts A's transaction and bumps the
// epoch) and publishes those rows itself. A resumes and commits: the broker
// must refuse it, and the topic holds every event once.
//
// The "different transactional ids" subtest runs the scenario with B under
// another transactional.id and resumes A as soon as B holds the lease:
// nothing fences A, and its commit goes through, which fails the assertion
// above. (There are still no duplicates: A's checkpoint record is in its
// transaction, and B's recovery does not use a checkpoint whose transaction
// is undecided, so it marks A's rows once A has committed. With a reader
// that stopped at the last stable offset, the same run gave 4 to 17
// duplicates.)
func TestRelayZombieFenced(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, sameTxnID bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		e := newRelayEnv(t, 2)
		w := startWriters(ctx, writerPool(t, e.db.URL), e.topic, 2, 8, 4, 0.1, 0)
		// A long transaction timeout: the coordinator must not abort A's
		// transaction on its own while A is frozen.
		args := append([]string{"-transaction-timeout", "60s"}, fastLease...)
		a := e.start("relay-a", []string{"ONCEFLOW_FAILPOINTS=" + failpoint.RelayBeforeKafkaCommit + "=15:stop"},
			append([]string{"-holder-id", "a"}, args...)...)
		if _, err := a.WaitFor(ctx, reReady); err != nil {
			t.Fatal(err)
		}
		bArgs := append([]string{"-holder-id", "b"}, args...)
		if !sameTxnID {
			bArgs = append(bArgs, "-transactional-id-prefix", e.txnPrefix+"other-")
		}
		b := e.start("relay-b", nil, bArgs...)
		if _, err := a.WaitFor(ctx, regexp.MustCompile(`failpoint `+failpoint.RelayBeforeKafkaCommit+`: SIGSTOP`)); err != nil {
			t.Fatal(err)
		}
		frozen := time.Now()
		resume := func() {
			a.Signal(syscall.SIGCONT)
			if _, err := a.WaitFor(ctx, reEnded); err != nil {
				t.Fatalf("zombie did not step down: %v", err)
			}
		}
		if sameTxnID {
			if _, err := b.WaitFor(ctx, reReady); err != nil {
				t.Fatal(err)
			}
			t.Logf("standby took over %s after the leader froze", time.Since(frozen).Round(time.Millisecond))
			waitPublished(t, ctx, e, publishedCount(t, ctx, e)+200)
			resume()
		} else {
			if _, err := b.WaitFor(ctx, reLeader); err != nil {
				t.Fatal(err)
			}
			resume()
			if _, err := b.WaitFor(ctx, reReady); err != nil {
				t.Fatal(err)
			}
		}
		out := a.Output()
		after := out[strings.LastIndex(out, "SIGSTOP"):]
		fenced := reFenced.MatchString(after)
		waitPublished(t, ctx, e, publishedCount(t, ctx, e)+200)
		if err := w.stop(); err != nil {
			t.Fatalf("writer: %v", err)
		}
		ck := testkit.NewChecker(t, e.db.Pool, e.topic)
		rep, err := ck.Check(ctx)
		if err != nil {
			t.Fatalf("checker: %v", err)
		}
		t.Logf("checker: %s; zombie's commit refused by the broker: %v", rep, fenced)
		if err := rep.Err(); err != nil {
			t.Error(err)
		}
		if fenced != sameTxnID {
			t.Errorf("zombie's commit refused by the broker: %v, want %v; its output after resuming:\n%s", fenced, sameTxnID, after)
		}
	}
	t.Run("same transactional id", func(t *testing.T) { t.Parallel(); run(t, true) })
	t.Run("different transactional ids", func(t *testing.T) { t.Parallel(); run(t, false) })
}

// TestRelaySlowCheckpointRecovery: the relay is killed right after a Kafka
// commit (before the mark), and the next one recovers while every
// connection to the checkpoint partition answers only after 3 s. Recovery
// must read the checkpoint to the end it measured and mark the killed
// batch, not conclude "no checkpoint" and publish it again. Three rounds;
// 0 duplicates. (Before, "nothing read for 2 s" meant "no newer
// checkpoint".)
func TestRelaySlowCheckpointRecovery(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 2)
	w := startWriters(ctx, writerPool(t, e.db.URL), e.topic, 2, 8, 4, 0.1, 0)
	for round := range 3 {
		killed := e.start(fmt.Sprintf("relay-kill-%d", round), []string{"ONCEFLOW_FAILPOINTS=" + failpoint.RelayAfterKafkaCommit + "=4"}, "-holder-id", "r")
		select {
		case <-killed.Done():
		case <-ctx.Done():
			t.Fatal("relay with failpoint did not die")
		}
		if !strings.Contains(killed.Output(), "failpoint "+failpoint.RelayAfterKafkaCommit) {
			t.Fatalf("relay exited without hitting its failpoint:\n%s", killed.Output())
		}
		t0 := time.Now()
		slow := e.start(fmt.Sprintf("relay-slow-%d", round), []string{"ONCEFLOW_FAILPOINTS=" + failpoint.RelaySlowCheckpoint + "=delay:3s"}, "-holder-id", "r")
		line, err := slow.WaitFor(ctx, reReadyMarked)
		if err != nil {
			t.Fatalf("%v\n%s", err, slow.Output())
		}
		took := time.Since(t0)
		marked, _ := strconv.Atoi(reReadyMarked.FindStringSubmatch(line)[1])
		t.Logf("round %d: recovered in %s through a checkpoint partition slow for 3s, marked %d rows of the killed batch", round, took.Round(time.Millisecond), marked)
		if marked == 0 {
			t.Errorf("round %d: recovery marked nothing: the killed batch will be published again\n%s", round, line)
		}
		waitPublished(t, ctx, e, publishedCount(t, ctx, e)+100)
		slow.Kill()
	}
	final := e.start("relay-final", nil, "-holder-id", "r")
	waitLeader(t, ctx, final)
	if err := w.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	e.check(ctx)
}

// TestRelayCheckpointBehindOpenTransaction: on the checkpoint topic it
// shares with other databases' relays, another relay holds a transaction
// open (a producer of the test's, under its own transactional.id), begun
// before our relay's last commit. Our relay is killed right after a Kafka
// commit. A read_committed reader stops at the other transaction's first
// record (the last stable offset), which hides our commit; recovery must
// still find that checkpoint, without waiting for the other transaction,
// and mark the batch instead of publishing it again.
func TestRelayCheckpointBehindOpenTransaction(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := newRelayEnv(t, 1)
	other := testkit.Client(t, kgo.TransactionalID(e.txnPrefix+"other-database"), kgo.TransactionTimeout(60*time.Second))
	if err := other.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := other.ProduceSync(ctx, &kgo.Record{Topic: e.checkpoint, Key: []byte("another-database/default"), Value: []byte("v2 db=another-database ids= fp=")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e.enqueueN(ctx, e.db, "s", "ev-", 30)
	killed := e.start("relay-killed", []string{"ONCEFLOW_FAILPOINTS=" + failpoint.RelayAfterKafkaCommit + "=1"}, "-holder-id", "r")
	if out := waitExit(t, ctx, killed); !strings.Contains(out, "failpoint "+failpoint.RelayAfterKafkaCommit) {
		t.Fatalf("relay exited without hitting its failpoint:\n%s", out)
	}
	p := e.start("relay-recovering", nil, "-holder-id", "r")
	line, err := p.WaitFor(ctx, reReadyMarked)
	if err != nil {
		t.Fatal(err)
	}
	marked, _ := strconv.Atoi(reReadyMarked.FindStringSubmatch(line)[1])
	if marked == 0 {
		t.Errorf("recovery marked nothing: the killed batch is published again\n%s", line)
	}
	// Only now does the other transaction end; the topic must hold every
	// event once.
	if err := other.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	rep := e.check(ctx)
	t.Logf("recovered while another transaction was open on the checkpoint partition, marked %d rows of the killed batch; %s", marked, rep)
}

// TestRelayDeleteOnPublishCrash: -delete-on-publish deletes rows once
// published, so the outbox cannot say what was committed; the writers also
// record each event id in a table of their own, in the event's transaction,
// and the checker compares the topic with that. 12 SIGKILLs at random
// moments plus one at each failpoint, writers committing and rolling back:
// 0 lost, 0 duplicated, order kept, no rolled-back event, outbox empty.
func TestRelayDeleteOnPublishCrash(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 3)
	if _, err := e.db.Pool.Exec(ctx, `CREATE TABLE public.committed_events (event_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	w := startWritersWith(ctx, writerPool(t, e.db.URL), e.topic, 3, 16, 4, 0.2, 0, writerExtras{CommittedTable: "public.committed_events"})
	args := append([]string{"-holder-id", "del", "-delete-on-publish"}, fastLease...)
	rng := rand.New(rand.NewPCG(2, uint64(time.Now().UnixNano())))
	const kills = 12
	for i := range kills {
		p := e.start(fmt.Sprintf("relay-%d", i), nil, args...)
		re := reReady
		if i%4 == 0 {
			re = reLeader
		}
		if _, err := p.WaitFor(ctx, re); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond) // the random kill moment, not a synchronisation
		p.Kill()
	}
	for _, fp := range []string{failpoint.RelayBeforeKafkaCommit, failpoint.RelayAfterKafkaCommit} {
		p := e.start("relay-"+fp, []string{"ONCEFLOW_FAILPOINTS=" + fp + "=3"}, args...)
		select {
		case <-p.Done():
		case <-ctx.Done():
			t.Fatalf("relay with failpoint %s did not die", fp)
		}
		if !strings.Contains(p.Output(), "failpoint "+fp+": SIGKILL") {
			t.Fatalf("relay exited without hitting failpoint %s:\n%s", fp, p.Output())
		}
	}
	final := e.start("relay-final", nil, args...)
	waitLeader(t, ctx, final)
	w.waitCommitted(t, ctx, 1000)
	if err := w.stop(); err != nil {
		t.Fatalf("writer: %v", err)
	}
	ck := testkit.NewChecker(t, e.db.Pool, e.topic).CommittedFrom(`SELECT event_id FROM public.committed_events`)
	rep, err := ck.Check(ctx)
	if err != nil {
		t.Fatalf("checker: %v", err)
	}
	t.Logf("checker (committed set from the writers' own table): %s, after %d SIGKILLs + 2 at failpoints", rep, kills)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if rep.Committed < 1000 {
		t.Fatalf("only %d events committed", rep.Committed)
	}
	assertNoRolledBack(t, w, ck)
	var left int
	if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d rows left in the outbox (%v): -delete-on-publish deletes every published row", left, err)
	}
}
