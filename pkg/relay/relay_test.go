package relay_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/logbuf"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/relay"
)

type relayBundle struct {
	bundle
	topic string
	reg   *prometheus.Registry
	logs  *logbuf.Buffer
	relay *relay.Relay
	done  chan error
	stop  context.CancelFunc
}

func startRelay(t *testing.T, topic string, mutate ...func(*relay.Config)) relayBundle {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	b := setup(t)
	ckpt := testkit.Topic(t, "ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	rb := relayBundle{bundle: b, topic: topic, reg: prometheus.NewRegistry(), logs: &logbuf.Buffer{}, done: make(chan error, 1)}
	cfg := relay.Config{
		CheckpointTopic:       ckpt,
		DB:                    b.db.Pool,
		KafkaOpts:             []kgo.Opt{kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(t), ",")...)},
		Logger:                slog.New(slog.NewJSONHandler(rb.logs, nil)),
		Registerer:            rb.reg,
		TransactionalIDPrefix: "unit-" + ckpt + "-",
	}
	for _, m := range mutate {
		m(&cfg)
	}
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rb.relay = r
	ctx, cancel := context.WithCancel(context.Background())
	rb.stop = cancel
	go func() { rb.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-rb.done
	})
	return rb
}

func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
}

// The engine publishes the envelope (key, headers, traceparent), counts it,
// shows leadership, and returns nil on cancel after releasing the lease.
func TestRelayPublishesEnvelope(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	topic := testkit.Topic(t, "unit", 2, nil)
	rb := startRelay(t, topic)
	m := outbox.Message{
		Topic: topic, Source: "order-88", EventType: "order.created", Payload: []byte(`{"n":1}`),
		EventID: "ev-1", Headers: map[string]string{"tenant": "acme"},
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	if _, err := rb.enqueue(t, outbox.Writer{}, m); err != nil {
		t.Fatal(err)
	}
	keyed := outbox.Message{Topic: topic, Source: "order-89", EventType: "x", Payload: []byte(`1`), EventID: "ev-2", Key: []byte("k")}
	if _, err := rb.enqueue(t, outbox.Writer{}, keyed); err != nil {
		t.Fatal(err)
	}
	cons := testkit.ReadCommittedClient(t, topic)
	got := map[string]envelope.Envelope{}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	for len(got) < 2 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("saw %d of 2 records; relay logs:\n%s", len(got), rb.logs)
		}
		fs.EachRecord(func(r *kgo.Record) {
			env, err := envelope.Decode(r, 0)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			got[env.EventID] = env
		})
	}
	e1 := got["ev-1"]
	if string(e1.RecordKey()) != "order-88" || e1.Seq != 1 || e1.EventType != "order.created" || e1.Headers["tenant"] != "acme" ||
		e1.Traceparent != m.Traceparent || e1.ContentType != envelope.ContentTypeJSON || string(e1.Payload) != `{"n":1}` {
		t.Fatalf("ev-1 decoded as %+v", e1)
	}
	if string(got["ev-2"].Key) != "k" {
		t.Fatalf("ev-2 key %q, want k", got["ev-2"].Key)
	}
	if !rb.relay.IsLeader() || rb.relay.Ready() != nil || rb.relay.Role() != "leader" {
		t.Fatalf("leader=%v ready=%v", rb.relay.IsLeader(), rb.relay.Ready())
	}
	waitUntil(t, "published_total", func() bool {
		return testutil.ToFloat64(metric(t, rb.reg, "onceflow_relay_published_total")) == 2
	})
	rb.stop()
	if err := <-rb.done; err != nil {
		t.Fatalf("Run returned %v", err)
	}
	rb.done <- nil // for cleanup
	var released bool
	if err := rb.db.Pool.QueryRow(context.Background(), `SELECT expires_at <= now() FROM onceflow.relay_lease`).Scan(&released); err != nil || !released {
		t.Fatalf("lease released=%v err=%v", released, err)
	}
	if rb.relay.IsLeader() {
		t.Fatal("still leader after Run returned")
	}
}

// A row for a topic that does not exist is set aside (reason topic_missing)
// with an error naming the topic, counted under errors_total{kind="topic"};
// a row of another source for an existing topic is published meanwhile. The
// relay tries the row again by itself and publishes it once the topic
// exists; a later row of its source waited behind it (order is kept).
func TestRelayMissingTopic(t *testing.T) {
	t.Parallel()
	missing := "missing-" + strings.ReplaceAll(t.Name(), "/", "_") + "-" + time.Now().Format("150405.000000")
	other := testkit.Topic(t, "unit", 1, nil)
	rb := startRelay(t, missing, func(c *relay.Config) { c.RetrySetAsideAfter = 300 * time.Millisecond })
	for _, m := range []outbox.Message{
		{Topic: missing, Source: "s", EventType: "x", Payload: []byte(`{}`)},
		{Topic: other, Source: "o", EventType: "x", Payload: []byte(`{}`)},
		{Topic: missing, Source: "s", EventType: "x", Payload: []byte(`{}`)},
	} {
		if _, err := rb.enqueue(t, outbox.Writer{}, m); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the row set aside, naming the topic, and the other source published", func() bool {
		var setAside, otherPublished bool
		_ = rb.db.Pool.QueryRow(context.Background(), `SELECT
			EXISTS (SELECT 1 FROM onceflow.outbox_set_aside WHERE reason = 'topic_missing' AND source = 's' AND resolved_at IS NULL AND error LIKE '%UNKNOWN_TOPIC_OR_PARTITION%'),
			EXISTS (SELECT 1 FROM onceflow.outbox WHERE source = 'o' AND id NOT IN (SELECT id FROM onceflow.outbox_pending))`).Scan(&setAside, &otherPublished)
		return setAside && otherPublished && strings.Contains(rb.logs.String(), missing) &&
			testutil.ToFloat64(metricLabel(t, rb.reg, "onceflow_relay_errors_total", "topic")) >= 1
	})
	var unpublished int
	if err := rb.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM onceflow.outbox_pending`).Scan(&unpublished); err != nil || unpublished != 2 {
		t.Fatalf("unpublished=%d err=%v: both rows of source s must wait", unpublished, err)
	}
	testkit.CreateTopic(t, missing, 1, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := testkit.NewChecker(t, rb.db.Pool, missing).Check(ctx)
	if err != nil {
		t.Fatalf("checker: %v\n%s", err, rb.logs)
	}
	if rep.Err() != nil || rep.Committed != 2 {
		t.Fatalf("%s %v", rep, rep.Err())
	}
	var resolution string
	if err := rb.db.Pool.QueryRow(ctx, `SELECT resolution FROM onceflow.outbox_set_aside WHERE source = 's'`).Scan(&resolution); err != nil || resolution != "published" {
		t.Fatalf("set-aside entry resolution %q (%v), want published", resolution, err)
	}
}

func metric(t *testing.T, g prometheus.Gatherer, name string) prometheus.Collector {
	t.Helper()
	return gathered{g: g, name: name}
}

func metricLabel(t *testing.T, g prometheus.Gatherer, name, kind string) prometheus.Collector {
	t.Helper()
	return gathered{g: g, name: name, kind: kind}
}

// gathered adapts one gathered series to testutil.ToFloat64.
type gathered struct {
	g          prometheus.Gatherer
	name, kind string
}

func (c gathered) Describe(ch chan<- *prometheus.Desc) {}

func (c gathered) Collect(ch chan<- prometheus.Metric) {
	mfs, err := c.g.Gather()
	if err != nil {
		return
	}
	for _, mf := range mfs {
		if mf.GetName() != c.name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if c.kind != "" && (len(m.GetLabel()) == 0 || m.GetLabel()[0].GetValue() != c.kind) {
				continue
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(c.name, "h", nil, nil), prometheus.UntypedValue, v)
			return
		}
	}
}

// With Listen and the trigger enabled, a new row is published long before
// the (here 30s) poll interval: the notification wakes the relay.
func TestRelayListenWakes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	topic := testkit.Topic(t, "unit", 1, nil)
	rb := startRelay(t, topic, func(c *relay.Config) {
		c.Listen = true
		c.PollInterval = 30 * time.Second
	})
	if _, err := rb.db.Pool.Exec(rb.ctx, `ALTER TABLE onceflow.outbox ENABLE TRIGGER outbox_notify`); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "leadership", rb.relay.IsLeader)
	// Let the first (empty) poll happen so that the relay is waiting.
	waitUntil(t, "the relay to be idle", func() bool { return strings.Contains(rb.logs.String(), "producer ready") })
	time.Sleep(200 * time.Millisecond) // let the relay enter its 30s wait; a shorter one only weakens the test
	start := time.Now()
	if _, err := rb.enqueue(t, outbox.Writer{}, outbox.Message{Topic: topic, Source: "s", EventType: "x", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the row to be published", func() bool {
		var n int
		_ = rb.db.Pool.QueryRow(rb.ctx, `SELECT count(*) FROM onceflow.outbox WHERE id NOT IN (SELECT id FROM onceflow.outbox_pending)`).Scan(&n)
		return n == 1
	})
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("published after %s: the notification did not wake the relay", took)
	}
}

// The relay's retention deletes published rows whole batches at a time,
// once their batch is older than Retention, with the batch's log row; it
// never deletes a pending row nor a batch still inside the retention.
func TestRelayRetentionPrunesWholeBatches(t *testing.T) {
	t.Parallel()
	missing := "missing-" + strings.ReplaceAll(t.Name(), "/", "_") + "-" + time.Now().Format("150405.000000")
	topic := testkit.Topic(t, "unit", 1, nil)
	rb := startRelay(t, topic, func(c *relay.Config) {
		c.BatchMaxRows = 10
		c.PruneBatchRows = 15
		c.PruneInterval = 50 * time.Millisecond
		c.Retention = time.Hour
		c.RetrySetAsideAfter = time.Hour
	})
	ctx := context.Background()
	one := func(q string) int64 {
		t.Helper()
		var n int64
		if err := rb.db.Pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	// A row that stays pending (its topic is missing: set aside, retried
	// in an hour), then 45 rows of another source in batches of at most 10.
	if _, err := rb.enqueue(t, outbox.Writer{}, outbox.Message{Topic: missing, Source: "waits", EventType: "x", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	for range 45 {
		if _, err := rb.enqueue(t, outbox.Writer{}, outbox.Message{Topic: topic, Source: "s", EventType: "x", Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "45 rows published, one pending", func() bool {
		return one(`SELECT count(*) FROM onceflow.outbox_pending`) == 1 &&
			one(`SELECT coalesce(sum(cardinality(ids)), 0) FROM onceflow.outbox_published`) == 45
	})
	batches := one(`SELECT count(*) FROM onceflow.outbox_published`)
	if batches < 5 {
		t.Fatalf("%d log rows for 45 rows in batches of at most 10", batches)
	}
	// Every batch but the newest is now two hours old.
	if _, err := rb.db.Pool.Exec(ctx, `UPDATE onceflow.outbox_published SET published_at = now() - interval '2 hours'
	                                    WHERE batch < (SELECT max(batch) FROM onceflow.outbox_published)`); err != nil {
		t.Fatal(err)
	}
	kept := one(`SELECT cardinality(ids) FROM onceflow.outbox_published ORDER BY batch DESC LIMIT 1`)
	waitUntil(t, "the old batches pruned", func() bool {
		return one(`SELECT count(*) FROM onceflow.outbox_published`) == 1
	})
	if n := one(`SELECT count(*) FROM onceflow.outbox WHERE source = 's'`); n != kept {
		t.Errorf("%d rows of source s left, want the newest batch's %d", n, kept)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox o JOIN onceflow.outbox_published l ON o.id = ANY (l.ids)`); n != kept {
		t.Errorf("%d rows left of the newest batch, want %d", n, kept)
	}
	if n := one(`SELECT count(*) FROM onceflow.outbox_pending p JOIN onceflow.outbox o ON o.id = p.id WHERE o.source = 'waits'`); n != 1 {
		t.Errorf("the pending row was pruned")
	}
	if got := testutil.ToFloat64(metric(t, rb.reg, "onceflow_relay_pruned_total")); got != float64(45-kept) {
		t.Errorf("onceflow_relay_pruned_total %v, want %d", got, 45-kept)
	}
}

// A relay whose wall clock is two minutes behind (Config.Clock, as
// ONCEFLOW_CLOCK_SKEW sets it in the binary) takes the lease and publishes
// as usual (the lease is on the database's clock) and stamps its records,
// the event's and the checkpoint's, with its own clock.
func TestRelayStampsRecordsWithItsClock(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	const skew = -2 * time.Minute
	topic := testkit.Topic(t, "unit", 1, nil)
	var ckptTopic string
	before := time.Now()
	rb := startRelay(t, topic, func(c *relay.Config) {
		c.Clock = func() time.Time { return time.Now().Add(skew) }
		ckptTopic = c.CheckpointTopic
	})
	if _, err := rb.enqueue(t, outbox.Writer{}, outbox.Message{Topic: topic, Source: "s-1", EventType: "x", Payload: []byte(`1`), EventID: "ev-skew"}); err != nil {
		t.Fatal(err)
	}
	for _, tp := range []string{topic, ckptTopic} {
		cons := testkit.ReadCommittedClient(t, tp)
		ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
		var rec *kgo.Record
		for rec == nil {
			fs := cons.PollFetches(ctx)
			if ctx.Err() != nil {
				cancel()
				t.Fatalf("no record on %s; relay logs:\n%s", tp, rb.logs)
			}
			fs.EachRecord(func(r *kgo.Record) { rec = r })
		}
		cancel()
		after := time.Now()
		if rec.Timestamp.Before(before.Add(skew).Truncate(time.Millisecond)) || rec.Timestamp.After(after.Add(skew)) {
			t.Fatalf("record on %s stamped %s, want within [%s, %s] (the relay's clock, %s off)", tp, rec.Timestamp, before.Add(skew), after.Add(skew), skew)
		}
	}
}
