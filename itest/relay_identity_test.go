package itest

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/outbox"
	relayadmin "github.com/onceflow/onceflow/pkg/relay/admin"
)

// waitExit waits for p to exit and returns its output; it fails the test if
// p keeps running.
func waitExit(t *testing.T, ctx context.Context, p *testkit.Proc) string {
	t.Helper()
	select {
	case <-p.Done():
	case <-ctx.Done():
		t.Fatalf("%s kept running; output:\n%s", p.Name, p.Output())
	}
	return p.Output()
}

// enqueueN commits n events for source with event ids prefix0…, one
// transaction each.
func (e *relayEnv) enqueueN(ctx context.Context, db *testkit.DB, source, prefix string, n int) {
	e.t.Helper()
	for i := range n {
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: e.topic, Source: source, EventType: "test.event",
				EventID: fmt.Sprintf("%s%d", prefix, i), Payload: []byte(`{}`)})
			return err
		})
		if err != nil {
			e.t.Fatalf("enqueue: %v", err)
		}
	}
}

// TestRelayCopiedDatabaseRefuses: a database whose relay has published is
// copied (CREATE DATABASE … TEMPLATE, as a staging copy or a clone would
// be). The copy carries the same identity; its relay must refuse to publish,
// naming the fix, instead of sharing the original's transactional.id and
// checkpoint. After `relay identity reset` it publishes under an identity
// of its own.
func TestRelayCopiedDatabaseRefuses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := newRelayEnv(t, 1)
	e.enqueueN(ctx, e.db, "orig", "orig-", 10)
	p := e.start("relay", nil, "-holder-id", "orig")
	waitPublished(t, ctx, e, 10)
	p.Kill()
	orig, err := relayadmin.ReadIdentity(ctx, e.db.Pool)
	if err != nil {
		t.Fatal(err)
	}

	e.db.Pool.Close() // a template may have no other session
	admin, err := pgx.Connect(ctx, testkit.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	name := e.db.Name + "_copy"
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{e.db.Name}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), testkit.DatabaseURL(t))
		if err == nil {
			_, _ = c.Exec(context.Background(), fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize()))
			c.Close(context.Background())
		}
	})
	cp := &testkit.DB{Name: name, URL: testkit.WithDatabase(testkit.DatabaseURL(t), name)}
	if cp.Pool, err = pgxpool.New(ctx, cp.URL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Pool.Close)
	e.enqueueN(ctx, cp, "copy", "copy-", 5)

	// The copy's relay uses the default transactional.id, derived from the
	// identity it shares with the original.
	start := func(name string) *testkit.Proc {
		return testkit.Start(t, name, testkit.Binary(t, "relay"), nil, "run",
			"-database-url", cp.URL, "-kafka-brokers", testkit.KafkaBrokers(t), "-checkpoint-topic", e.checkpoint,
			"-http-addr", "127.0.0.1:0", "-holder-id", "copy")
	}
	out := waitExit(t, ctx, start("relay-copy"))
	if !strings.Contains(out, "was copied or moved") || !strings.Contains(out, "relay identity reset") || !strings.Contains(out, orig.ID) {
		t.Fatalf("the copy's relay did not refuse naming the fix; output:\n%s", out)
	}
	var published int
	if err := cp.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox WHERE source = 'copy' AND id NOT IN (SELECT id FROM onceflow.outbox_pending)`).Scan(&published); err != nil || published != 0 {
		t.Fatalf("the refusing relay published %d rows (%v)", published, err)
	}
	show, err := relayCmd(t, cp, "identity", "show")
	if err != nil || !strings.Contains(show, "not where its identity belongs") {
		t.Fatalf("relay identity show: %v\n%s", err, show)
	}
	if out, err := relayCmd(t, cp, "identity", "reset", "-note", "staging copy, publishes on its own"); err != nil {
		t.Fatalf("relay identity reset: %v\n%s", err, out)
	}
	p = start("relay-copy-reset")
	ck := testkit.NewChecker(t, cp.Pool, e.topic).Only(func(e envelope.Envelope) bool { return strings.HasPrefix(e.EventID, "copy-") }).
		CommittedFrom(`SELECT event_id FROM onceflow.outbox WHERE source = 'copy'`)
	rep, err := ck.Check(ctx)
	if err != nil {
		t.Fatalf("checker: %v\n%s", err, p.Output())
	}
	now, err := relayadmin.ReadIdentity(ctx, cp.Pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("copy refused with the original's identity %s; after reset (identity %s): %s", orig.ID, now.ID, rep)
	if err := rep.Err(); err != nil || rep.Committed != 5 || now.ID == orig.ID {
		t.Fatalf("%v %s new identity %s", err, rep, now.ID)
	}
}

// TestRelayRestoredDatabaseRefuses: the database is restored to a point
// before the relay's last batches (simulated: the later rows deleted and the
// outbox sequence set back). Its relay must refuse: the checkpoint names ids
// the sequence has not handed out. Once new rows are written at those ids,
// the checkpoint names rows holding other events: the relay must refuse
// again, never mark them. After `relay identity reset` every new event is
// published.
func TestRelayRestoredDatabaseRefuses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := newRelayEnv(t, 1)
	e.enqueueN(ctx, e.db, "s", "before-", 20)
	p := e.start("relay", nil, "-holder-id", "r")
	waitPublished(t, ctx, e, 20)
	p.Kill()
	// As a restore to the point where ids up to 5 existed: the rows, the
	// publish log's batches, the sequence and the counters go back.
	if _, err := e.db.Pool.Exec(ctx, `
		DELETE FROM onceflow.outbox WHERE id > 5;
		DELETE FROM onceflow.outbox_published WHERE last_id > 5;
		SELECT setval(pg_get_serial_sequence('onceflow.outbox', 'id'), 5);
		UPDATE onceflow.source_seq SET last_seq = 5 WHERE source = 's';
		DELETE FROM onceflow.source_seq_moves WHERE source = 's' AND last_seq > 5`); err != nil {
		t.Fatal(err)
	}
	out := waitExit(t, ctx, e.start("relay-restored", nil, "-holder-id", "r"))
	if !regexp.MustCompile(`names outbox ids up to 20, but this database's outbox sequence has handed out ids only up to 5`).MatchString(out) ||
		!strings.Contains(out, "relay identity reset") {
		t.Fatalf("the relay of the restored database did not refuse; output:\n%s", out)
	}
	e.enqueueN(ctx, e.db, "s", "after-", 30) // ids 6..35: the checkpoint's ids now hold other events
	out = waitExit(t, ctx, e.start("relay-rewritten", nil, "-holder-id", "r"))
	if !strings.Contains(out, "recorded another event for outbox row") {
		t.Fatalf("the relay marked rows its checkpoint does not describe; output:\n%s", out)
	}
	var marked int
	if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox WHERE event_id LIKE 'after-%' AND id NOT IN (SELECT id FROM onceflow.outbox_pending)`).Scan(&marked); err != nil || marked != 0 {
		t.Fatalf("%d rows written after the restore were marked published (%v)", marked, err)
	}
	if out, err := relayCmd(t, e.db, "identity", "reset", "-note", "restored from backup; source_seq checked"); err != nil {
		t.Fatalf("reset: %v\n%s", err, out)
	}
	e.start("relay-after-reset", nil, "-holder-id", "r")
	ck := testkit.NewChecker(t, e.db.Pool, e.topic).Only(func(e envelope.Envelope) bool { return strings.HasPrefix(e.EventID, "after-") }).
		CommittedFrom(`SELECT event_id FROM onceflow.outbox WHERE event_id LIKE 'after-%'`)
	rep, err := ck.Check(ctx)
	if err != nil {
		t.Fatalf("checker: %v", err)
	}
	t.Logf("restored database refused twice (sequence behind the checkpoint, then rows rewritten); after reset: %s", rep)
	if err := rep.Err(); err != nil || rep.Committed != 30 {
		t.Fatalf("%v %s", err, rep)
	}
}

// TestRelayLegacyCheckpoint: a database upgraded from the relay version
// before identities. Its old relay left a version-1 checkpoint under the
// bare shard name, naming rows it published but had not marked. The new
// relay cannot prove that checkpoint is this database's (every database's
// relay wrote that key), so it refuses until an operator decides; with
// `relay identity legacy adopt` it marks those rows (no duplicate) and
// publishes the rest. A shard name whose old relay left no checkpoint is
// settled without asking.
func TestRelayLegacyCheckpoint(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := newRelayEnv(t, 1)
	e.enqueueN(ctx, e.db, "s", "ev-", 6) // ids 1..6
	if _, err := e.db.Pool.Exec(ctx, `INSERT INTO onceflow.relay_legacy_checkpoint (shard) VALUES ('default'), ('other')`); err != nil {
		t.Fatal(err)
	}
	// The old relay published ids 4..6 and died before marking them.
	cl := testkit.Client(t)
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: e.checkpoint, Key: []byte("default"), Value: []byte("v1 4-6")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	out := waitExit(t, ctx, e.start("relay-upgraded", nil, "-holder-id", "r"))
	if !strings.Contains(out, "relay identity legacy adopt -shard default") || !strings.Contains(out, "relay identity legacy discard -shard default") {
		t.Fatalf("the relay did not refuse the unproven legacy checkpoint; output:\n%s", out)
	}
	if out, err := relayCmd(t, e.db, "identity", "legacy", "adopt", "-shard", "default", "-note", "this service alone used the checkpoint topic"); err != nil {
		t.Fatalf("legacy adopt: %v\n%s", err, out)
	}
	// The note is kept with the decision, and shown.
	var note string
	if err := e.db.Pool.QueryRow(ctx, `SELECT decision_note FROM onceflow.relay_legacy_checkpoint WHERE shard = 'default'`).Scan(&note); err != nil ||
		note != "this service alone used the checkpoint topic" {
		t.Fatalf("decision_note %q, %v", note, err)
	}
	if out, err := relayCmd(t, e.db, "identity", "show"); err != nil || !strings.Contains(out, "(note: this service alone used the checkpoint topic)") {
		t.Fatalf("identity show does not show the note: %v\n%s", err, out)
	}
	p := e.start("relay-adopted", nil, "-holder-id", "r")
	if _, err := p.WaitFor(ctx, regexp.MustCompile(`"msg":"legacy checkpoint settled".*adopted, 3 rows marked published`)); err != nil {
		t.Fatalf("%v\n%s", err, p.Output())
	}
	waitPublished(t, ctx, e, 6)
	got := publishedPerSource(t, ctx, e.topic)
	if fmt.Sprint(got["s"]) != "[1 2 3]" {
		t.Fatalf("published seqs %v, want [1 2 3] (4..6 were the old relay's)", got["s"])
	}
	// Another shard name, whose old relay left no checkpoint: settled by
	// the same relay, without asking (every legacy name is settled before
	// any publishing, whatever the shard layout now).
	if _, err := p.WaitFor(ctx, regexp.MustCompile(`"msg":"legacy checkpoint settled".*"legacy_shard":"other".*no checkpoint under the legacy key`)); err != nil {
		t.Fatalf("%v\n%s", err, p.Output())
	}
	show, err := relayCmd(t, e.db, "identity", "show")
	if err != nil || strings.Contains(show, "unsettled") {
		t.Fatalf("identity show: %v\n%s", err, show)
	}
	t.Logf("relay identity show:\n%s", show)
}

// TestRelayLegacyCheckpointToShards: a database whose unsharded relay ran
// before identities (shard "default") is upgraded straight to -shards 2.
// Neither shard is named "default", yet both must settle that legacy
// checkpoint before publishing: without a decision they refuse naming it;
// after `relay identity legacy adopt -shard default` the rows it names
// (published by the old relay, never marked) are marked, not published
// again. 12 events, ids 7..12 named by the legacy checkpoint: exactly 6
// records on the topic.
func TestRelayLegacyCheckpointToShards(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 2)
	for i := range 12 {
		e.enqueueN(ctx, e.db, fmt.Sprintf("s%d", i%4), fmt.Sprintf("ev%d-", i), 1)
	}
	if _, err := e.db.Pool.Exec(ctx, `INSERT INTO onceflow.relay_legacy_checkpoint (shard) VALUES ('default')`); err != nil {
		t.Fatal(err)
	}
	cl := testkit.Client(t)
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: e.checkpoint, Key: []byte("default"), Value: []byte("v1 7-12")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	out := waitExit(t, ctx, e.startShard("relay-0-undecided", nil, 0, 2))
	if !strings.Contains(out, "relay identity legacy adopt -shard default") {
		t.Fatalf("shard 0 of 2 did not refuse the unsettled legacy checkpoint of shard default; output:\n%s", out)
	}
	if out, err := relayCmd(t, e.db, "identity", "legacy", "adopt", "-shard", "default", "-note", "this service alone used the checkpoint topic"); err != nil {
		t.Fatalf("legacy adopt: %v\n%s", err, out)
	}
	e.startShard("relay-0", nil, 0, 2)
	e.startShard("relay-1", nil, 1, 2)
	waitPublished(t, ctx, e, 12)
	got := publishedPerSource(t, ctx, e.topic)
	n := 0
	for _, seqs := range got {
		n += len(seqs)
	}
	var outcome string
	if err := e.db.Pool.QueryRow(ctx, `SELECT outcome FROM onceflow.relay_legacy_checkpoint WHERE shard = 'default'`).Scan(&outcome); err != nil {
		t.Fatal(err)
	}
	t.Logf("legacy checkpoint of shard default under -shards 2: %d records on the topic (%v); outcome %q", n, got, outcome)
	// Both shards settle the legacy checkpoint at once; the first to
	// record its outcome wins, and it may be the one that found the rows
	// already marked by the other: either way the outcome is an adoption
	// (never "nothing to do"), with the 6 records.
	if n != 6 || !strings.Contains(outcome, ": adopted") {
		t.Fatalf("%d records on the topic, want 6 (ids 7..12 were the old relay's); outcome %q", n, outcome)
	}
	var unmarked int
	if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox_pending`).Scan(&unmarked); err != nil || unmarked != 0 {
		t.Fatalf("%d rows still queued (%v), want every row published or marked", unmarked, err)
	}
}
