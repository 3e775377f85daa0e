package retention_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/retention"
)

const retentionJSON = `{
  "classes": [
    {"match": "audit.*", "keep": "permanent"},
    {"match": "ping.*", "keep": "1h"},
    {"match": "*", "keep": "720h"}
  ],
  "sources": [{"source": "monitor", "horizon": "30m", "event_types": ["ping.*", "audit.login"]}]
}`

func TestParseRetention(t *testing.T) {
	r, err := retention.Parse([]byte(retentionJSON))
	if err != nil {
		t.Fatal(err)
	}
	for et, want := range map[string]string{"audit.login": "audit.*", "ping.a": "ping.*", "order.placed": "*"} {
		if c, ok := r.ClassOf(et); !ok || c.Match != want {
			t.Errorf("ClassOf(%q) = %+v, want %s", et, c, want)
		}
	}
	if r.AdminAuditTTL() != retention.DefaultKeepAdminAudit || r.ResolvedSetAsideTTL() != retention.DefaultKeepResolvedSetAside {
		t.Errorf("operator records kept %s and %s by default, want 90 days", r.AdminAuditTTL(), r.ResolvedSetAsideTTL())
	}
	bad := map[string]string{
		`{"classes":[]}`: "at least one",
		`{"classes":[{"match":"[","keep":"1h"}]}`:                                           "is not a glob",
		`{"classes":[{"match":"*","keep":"forever"}]}`:                                      `want "permanent" or a positive duration`,
		`{"classes":[{"match":"*","keep":"1h"}],"x":1}`:                                     "unknown field",
		`{"classes":[{"match":"*","keep":"1h"}],"sources":[{"source":"s","horizon":"1h"}]}`: "event_types",
		// Test 4 (library level): a TTL shorter than a source's horizon.
		`{"classes":[{"match":"ping.*","keep":"24h"}],"sources":[{"source":"stripe-webhooks","horizon":"72h","event_types":["ping.x"]}]}`: `class "ping.*" keeps 24h0m0s, shorter than source "stripe-webhooks"'s redelivery horizon 72h0m0s`,
		// The operator records' floors.
		`{"classes":[{"match":"*","keep":"1h"}],"keep_admin_audit":"24h"}`:       `keep_admin_audit "24h": want "permanent" or a duration of at least 720h0m0s`,
		`{"classes":[{"match":"*","keep":"1h"}],"keep_resolved_set_aside":"1h"}`: `keep_resolved_set_aside "1h": want "permanent" or a duration of at least 24h0m0s`,
	}
	for cfg, want := range bad {
		if _, err := retention.Parse([]byte(cfg)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", cfg, err, want)
		}
	}
}

// TestPrune (test 3): a TTL class is pruned after its window, a permanent
// class never; parked, held and dead rows, intents and unpublished outbox
// rows are never pruned; only one replica prunes at a time.
func TestPrune(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	r, err := retention.Parse([]byte(retentionJSON))
	if err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	inbox := func(id, et, status string, age time.Duration) {
		exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, received_at)
		      VALUES ('default', $1, 'monitor', $2, 't', 0, 0, $3, now() - $4::interval)`, id, et, status, age.String())
	}
	for i := range 20 {
		inbox("ping-old-"+string(rune('a'+i)), "ping.a", "processed", 2*time.Hour)
	}
	inbox("ping-new", "ping.a", "processed", 10*time.Minute)
	inbox("ping-parked", "ping.a", "parked", 2*time.Hour)
	inbox("ping-held", "ping.a", "held", 2*time.Hour)
	inbox("ping-dead", "ping.a", "dead", 2*time.Hour)
	inbox("ping-late", "ping.a", "processed", 2*time.Hour)
	exec(`UPDATE onceflow.inbox SET late = true WHERE event_id = 'ping-late'`) // applied late: kept
	inbox("audit-old", "audit.login", "processed", 5000*time.Hour)
	inbox("order-old", "order.placed", "processed", 100*time.Hour)
	inbox("order-older", "order.placed", "processed", 800*time.Hour)
	// Another consumer's expired row and effect, and an unscoped effect:
	// never pruned by the default consumer's prune.
	exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, received_at)
	      VALUES ('other', 'ping-old-a', 'monitor', 'ping.a', 't', 0, 0, 'processed', now() - interval '2h')`)
	mine, other := effects.ConsumerScope("default", "http", "*"), effects.ConsumerScope("other", "http", "*")
	exec(`INSERT INTO onceflow.effects (scope, idempotency_key, event_id, status) VALUES
	      ($1, 'event:ping-old-a', 'ping-old-a', 'done'), ($1, 'event:ping-old-b', 'ping-old-b', 'intent'), ($1, 'event:audit-old', 'audit-old', 'done'),
	      ($2, 'event:ping-old-a', 'ping-old-a', 'done'), ('', 'event:ping-old-c', 'ping-old-c', 'done')`, mine, other)
	exec(`INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, record_key, payload, created_at) VALUES
	      ('o1', 't', 's', 1, 'ping.a', 'application/json', ''::bytea, '{}'::bytea, now() - interval '3h'),
	      ('o2', 't', 's', 2, 'ping.a', 'application/json', ''::bytea, '{}'::bytea, now() - interval '3h'),
	      ('o3', 't', 's', 3, 'audit.x', 'application/json', ''::bytea, '{}'::bytea, now() - interval '3h')`)
	// o1 and o3 were published two hours ago (one batch); o2 is pending.
	exec(`WITH m AS (DELETE FROM onceflow.outbox_pending p USING onceflow.outbox o
	                  WHERE o.id = p.id AND o.event_id IN ('o1', 'o3') RETURNING p.id)
	      INSERT INTO onceflow.outbox_published (published_at, first_id, last_id, ids)
	      SELECT now() - interval '2h', min(id), max(id), array_agg(id ORDER BY id) FROM m`)

	// Another replica holds the pruning lock: this one skips.
	holder, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(3839, hashtext('prune' || E'\n' || 'default'))`); err != nil {
		t.Fatal(err)
	}
	if st, err := retention.Prune(ctx, db.Pool, r, retention.Options{BatchSize: 7}); err != nil || !st.Skipped || st.Inbox != 0 {
		t.Fatalf("prune while another replica prunes: %+v, %v", st, err)
	}
	// Another consumer's pruner is not blocked by it; it prunes none of the
	// default consumer's rows (only the published outbox row, which belongs
	// to no consumer).
	if st, err := retention.Prune(ctx, db.Pool, r, retention.Options{Consumer: "nobody"}); err != nil || st.Skipped || st.Inbox+st.Effects != 0 || st.Outbox != 1 {
		t.Fatalf("another consumer's prune: %+v, %v", st, err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock(3839, hashtext('prune' || E'\n' || 'default'))`); err != nil {
		t.Fatal(err)
	}
	holder.Release()

	st, err := retention.Prune(ctx, db.Pool, r, retention.Options{BatchSize: 7, Pause: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if st.Inbox != 21 || st.Effects != 1 || st.Outbox != 0 || st.Skipped {
		t.Fatalf("pruned %+v, want inbox 21 (20 old pings + order-older), effects 1, outbox 0 (pruned above)", st)
	}
	var left []string
	rows, _ := db.Pool.Query(ctx, `SELECT event_id FROM onceflow.inbox WHERE consumer = 'default' ORDER BY event_id`)
	for rows.Next() {
		var id string
		_ = rows.Scan(&id)
		left = append(left, id)
	}
	rows.Close()
	want := []string{"audit-old", "order-old", "ping-dead", "ping-held", "ping-late", "ping-new", "ping-parked"}
	if !slices.Equal(left, want) {
		t.Fatalf("inbox left %q, want %q", left, want)
	}
	var effectsLeft, outboxLeft int
	_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.effects`).Scan(&effectsLeft)
	_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&outboxLeft)
	if effectsLeft != 4 || outboxLeft != 2 {
		t.Fatalf("effects left %d (want the intent, the permanent one, the other consumer's and the unscoped one), outbox left %d (want unpublished and permanent)", effectsLeft, outboxLeft)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM onceflow.inbox WHERE consumer = 'other'`); n != 1 {
		t.Fatalf("the other consumer's inbox row was pruned")
	}
	if st, err := retention.Prune(ctx, db.Pool, r, retention.Options{}); err != nil || st.Inbox+st.Effects+st.Outbox != 0 {
		t.Fatalf("second prune: %+v, %v", st, err)
	}
}

// TestPruneOperatorRecords: audit rows of the pruning consumer older than
// their keep (90 days by default) and set-aside rows resolved longer ago
// than theirs go, in batches, even when every event class is permanent;
// recent audit rows, another consumer's, a running one, recent resolved
// set-aside rows and open ones (however old) stay; "permanent" keeps them
// all.
func TestPruneOperatorRecords(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// id, consumer, age in days, outcome
	exec(`INSERT INTO onceflow.admin_audit (request_id, consumer, action, actor, via, params, outcome, created_at)
	      SELECT 'old-' || g, 'default', 'dlq.replay', 'alice', 'cli', '{}', 'ok', now() - interval '100 days' - g * interval '1 s'
	        FROM generate_series(1, 5) g`)
	exec(`INSERT INTO onceflow.admin_audit (request_id, consumer, action, actor, via, params, outcome, created_at) VALUES
	      ('recent', 'default', 'gap.resolve', 'bob', 'cli', '{}', 'ok', now() - interval '89 days'),
	      ('running', 'default', 'dlq.replay', 'bob', 'cli', '{}', 'running', now() - interval '100 days'),
	      ('other', 'billing', 'dlq.replay', 'carol', 'cli', '{}', 'ok', now() - interval '100 days')`)
	exec(`INSERT INTO onceflow.outbox_set_aside (outbox_id, event_id, topic, source, seq, event_type, reason, error, set_aside_at, resolved_at, resolution) VALUES
	      (1, 'e1', 't', 's', 1, 'x', 'too_large', 'e', now() - interval '200 days', now() - interval '100 days', 'skipped'),
	      (2, 'e2', 't', 's', 2, 'x', 'too_large', 'e', now() - interval '200 days', now() - interval '95 days', 'published'),
	      (3, 'e3', 't', 's', 3, 'x', 'too_large', 'e', now() - interval '200 days', now() - interval '10 days', 'published'),
	      (4, 'e4', 't', 'z', 1, 'x', 'invalid_topic', 'e', now() - interval '200 days', NULL, NULL)`)

	keepAll, err := retention.Parse([]byte(`{"classes":[{"match":"*","keep":"permanent"}],"keep_admin_audit":"permanent","keep_resolved_set_aside":"permanent"}`))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := retention.Prune(ctx, db.Pool, keepAll, retention.Options{}); err != nil || st != (retention.Stats{}) {
		t.Fatalf("prune with everything permanent: %+v, %v", st, err)
	}
	r, err := retention.Parse([]byte(`{"classes":[{"match":"*","keep":"permanent"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	st, err := retention.Prune(ctx, db.Pool, r, retention.Options{BatchSize: 2, Pause: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if st.AdminAudit != 5 || st.SetAside != 2 || st.Inbox+st.Effects+st.Outbox != 0 {
		t.Fatalf("pruned %+v, want admin_audit 5 (older than 90 days), outbox_set_aside 2 (resolved over 90 days ago)", st)
	}
	var audit, setAside []string
	for q, into := range map[string]*[]string{
		`SELECT request_id FROM onceflow.admin_audit ORDER BY request_id`:          &audit,
		`SELECT outbox_id::text FROM onceflow.outbox_set_aside ORDER BY outbox_id`: &setAside,
	} {
		rows, err := db.Pool.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if *into, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(audit, []string{"other", "recent", "running"}) || !slices.Equal(setAside, []string{"3", "4"}) {
		t.Fatalf("left audit %q (want other, recent, running), set-aside %q (want 3: resolved 10 days ago, 4: open)", audit, setAside)
	}
}

// TestPruneInsertLatency measures how long inbox inserts take while
// 100,000 expired rows (received a millisecond apart) are pruned in batches
// of 500 (figure in the log). ONCEFLOW_TEST_PRUNE_ROWS sets another size
// (the 1M-row figure in docs/effects.md was taken with it).
func TestPruneInsertLatency(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	rows := int64(100_000)
	if v, err := strconv.ParseInt(os.Getenv("ONCEFLOW_TEST_PRUNE_ROWS"), 10, 64); err == nil && v > 0 {
		rows = v
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, received_at)
	  SELECT 'default', 'old-' || g, 'src', 'ping.a', 't', 0, g, 'processed', now() - interval '2h' - g * interval '1 ms' FROM generate_series(1, $1) g`, rows); err != nil {
		t.Fatal(err)
	}
	r, err := retention.Parse([]byte(retentionJSON))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var (
		mu    sync.Mutex
		lat   []time.Duration
		wg    sync.WaitGroup
		start = time.Now()
	)
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			t0 := time.Now()
			_, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status)
			  VALUES ('default', $1, 'src', 'ping.a', 't', 0, $2, 'processed')`, "new-"+time.Now().Format("150405.000000000")+"-"+string(rune('a'+i%26)), i)
			d := time.Since(t0)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			lat = append(lat, d)
			mu.Unlock()
		}
	})
	st, err := retention.Prune(ctx, db.Pool, r, retention.Options{BatchSize: 500, Pause: 2 * time.Millisecond})
	took := time.Since(start)
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if st.Inbox != rows {
		t.Fatalf("pruned %d inbox rows, want %d", st.Inbox, rows)
	}
	slices.Sort(lat)
	p99, maxLat := lat[len(lat)*99/100], lat[len(lat)-1]
	t.Logf("pruned %d rows in %s (batches of 500); %d concurrent inbox inserts: p50 %s, p99 %s, max %s", st.Inbox, took.Round(time.Millisecond), len(lat), lat[len(lat)/2], p99, maxLat)
	// An insert that waited on the prune (a lock held across its batches)
	// would take about as long as the prune; scheduling on a loaded machine
	// costs far less than a third of it. (A fixed bound of a second failed
	// at load averages of 14–20.)
	if maxLat > took/3 {
		t.Fatalf("an inbox insert took %s while pruning (the prune took %s): it waited on the prune", maxLat, took.Round(time.Millisecond))
	}
}

// TestRunPruner: the periodic pruner counts pruned rows by table and passes
// by result, and stops with its context.
func TestRunPruner(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := retention.Parse([]byte(retentionJSON))
	if err != nil {
		t.Fatal(err)
	}
	// A past bucket of a 720h lane (the classes published first), which
	// the pass seals; then 30 expired legacy rows, which it prunes.
	if _, err := retention.Prune(ctx, db.Pool, r, retention.Options{}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SELECT onceflow.inbox_lane('default', 'order.placed')`,
		`SELECT onceflow.inbox_ensure_buckets('default', 'ttl-2592000s', now() - interval '200 hours')`,
		`INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at)
		  VALUES ('default', 'order-1', 'src', 'order.placed', 't', 0, 0, 'processed', 'ttl-2592000s', now() - interval '200 hours')`,
		`INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, received_at)
		  SELECT 'default', 'old-' || g, 'src', 'ping.a', 't', 0, g, 'processed', now() - interval '2h' FROM generate_series(1, 30) g`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	reg := prometheus.NewRegistry()
	m, err := retention.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- retention.Run(ctx, db.Pool, r, time.Hour, retention.Options{BatchSize: 8}, m, nil)
	}()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for testutil.ToFloat64(m.Runs.WithLabelValues("ok")) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("no pruning pass within 30s")
		}
		<-tick.C
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Pruned.WithLabelValues("inbox")); got != 30 {
		t.Fatalf("onceflow_consumer_retention_pruned_total{table=inbox} = %v, want 30", got)
	}
	if got := testutil.ToFloat64(m.Buckets.WithLabelValues("sealed")); got != 2 {
		t.Fatalf("onceflow_consumer_retention_buckets_total{action=sealed} = %v, want 2 (the past bucket and the one after it)", got)
	}
}

// TestOldestAgeByClass: the oldest processed row's age per class, by the
// class's glob; rows that are not processed do not count.
func TestOldestAgeByClass(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, received_at) VALUES
	  ('default', 'a1', 'src', 'audit.login', 't', 0, 1, 'processed', now() - interval '48 hours'),
	  ('default', 'a2', 'src', 'audit.logout', 't', 0, 2, 'processed', now() - interval '1 hour'),
	  ('default', 'p1', 'src', 'ping.a', 't', 0, 3, 'processed', now() - interval '10 minutes'),
	  ('default', 'p2', 'src', 'ping.b', 't', 0, 4, 'dead', now() - interval '99 hours'),
	  ('default', 'o1', 'src', 'order.placed', 't', 0, 5, 'processed', now() - interval '5 hours')`); err != nil {
		t.Fatal(err)
	}
	r, err := retention.Parse([]byte(retentionJSON))
	if err != nil {
		t.Fatal(err)
	}
	ages, err := retention.OldestAgeByClass(ctx, db.Pool, r, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Duration{"audit.*": 48 * time.Hour, "ping.*": 10 * time.Minute, "*": 5 * time.Hour}
	if len(ages) != len(want) {
		t.Fatalf("ages = %v, want classes %v", ages, want)
	}
	for class, w := range want {
		if got := ages[class]; got < w || got > w+time.Minute {
			t.Errorf("class %s: oldest age %s, want %s", class, got, w)
		}
	}
}

func count(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// Options.Validate refuses an explicit zero batch size or empty consumer
// (Prune fills both with their defaults).
func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	if err := (retention.Options{BatchSize: retention.DefaultBatchSize, Consumer: retention.DefaultConsumer}).Validate(); err != nil {
		t.Fatal(err)
	}
	for field, o := range map[string]retention.Options{"BatchSize": {Consumer: "c"}, "Consumer": {BatchSize: 1}} {
		var ce *retention.ConfigError
		if err := o.Validate(); !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s: %v", field, err)
		}
	}
}

// TestPruneBuckets: an expired time bucket of the inbox is removed whole
// (truncated, then dropped), after its parked, held, dead and late rows
// moved to the legacy partition; a bucket still within its lane's TTL, the
// permanent lane and a longer TTL lane keep every row. A type moved to a
// permanent class after its lane was recorded keeps its lane's buckets.
func TestPruneBuckets(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	r, err := retention.Parse([]byte(retentionJSON))
	if err != nil {
		t.Fatal(err)
	}
	// The first pass publishes the classes; the lanes are then recorded as
	// the consumer records them.
	if _, err := retention.Prune(ctx, db.Pool, r, retention.Options{}); err != nil {
		t.Fatal(err)
	}
	lanes := map[string]string{}
	for _, typ := range []string{"ping.a", "audit.login", "order.placed", "ping.moved"} {
		var l string
		if err := db.Pool.QueryRow(ctx, `SELECT onceflow.inbox_lane('default', $1)`, typ).Scan(&l); err != nil {
			t.Fatal(err)
		}
		lanes[typ] = l
	}
	if lanes["ping.a"] != "ttl-3600s" || lanes["audit.login"] != "permanent" || lanes["order.placed"] != "ttl-2592000s" {
		t.Fatalf("lanes %v", lanes)
	}
	for _, at := range []string{"now() - interval '5 hours'", "now()"} {
		exec(`SELECT onceflow.inbox_ensure_buckets('default', 'ttl-3600s', ` + at + `)`)
		exec(`SELECT onceflow.inbox_ensure_buckets('default', 'ttl-2592000s', ` + at + `)`)
	}
	exec(`SELECT onceflow.inbox_ensure_buckets('default', 'permanent')`)
	ins := func(id, typ, status string, late bool, ago string) {
		t.Helper()
		exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, late, lane, event_at, received_at)
		  VALUES ('default', $1, 'src', $2, 't', 0, 0, $3, $4, $5, now() - $6::interval, now() - $6::interval)`, id, typ, status, late, lanes[typ], ago)
	}
	exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at, received_at)
	  SELECT 'default', 'old-' || g, 'src', 'ping.a', 't', 0, g, 'processed', 'ttl-3600s', now() - interval '5 hours', now() - interval '5 hours'
	  FROM generate_series(1, 1000) g`)
	for _, k := range []struct{ id, status string }{{"parked", "parked"}, {"held", "held"}, {"dead", "dead"}} {
		ins(k.id, "ping.a", k.status, false, "5 hours")
	}
	ins("late", "ping.a", "processed", true, "5 hours")
	ins("fresh", "ping.a", "processed", false, "1 minute")
	ins("kept-permanent", "audit.login", "processed", false, "5 hours")
	ins("kept-720h", "order.placed", "processed", false, "5 hours")
	// Another consumer's bucket of the same time is its own pruner's.
	exec(`SELECT onceflow.inbox_ensure_buckets('other', 'ttl-3600s', now() - interval '5 hours')`)
	exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, lane, event_at, received_at)
	  VALUES ('other', 'o1', 'src', 'ping.a', 't', 0, 0, 'processed', 'ttl-3600s', now() - interval '5 hours', now() - interval '5 hours')`)
	buckets := count(`SELECT count(*) FROM onceflow.inbox_buckets WHERE consumer = 'default'`)

	st, err := retention.Prune(ctx, db.Pool, r, retention.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The bucket of 5 hours ago and the next one made with it expired.
	// (Inbox counts the buckets' rows by the planner's estimate once a
	// bucket is analyzed, which autovacuum may do meanwhile: not judged.)
	if st.InboxBuckets != 2 || st.BucketsBusy != 0 {
		t.Fatalf("pruned %+v, want the 1000 processed rows of two buckets", st)
	}
	if n := count(`SELECT count(*) FROM onceflow.inbox_buckets WHERE consumer = 'default'`); n != buckets-2 {
		t.Fatalf("%d buckets left, want %d", n, buckets-2)
	}
	if n, want := count(`SELECT count(*) FROM pg_inherits WHERE inhparent = 'onceflow.inbox'::regclass`),
		count(`SELECT count(*) + 2 FROM onceflow.inbox_buckets`); n != want {
		t.Fatalf("%d partitions, want %d (the buckets, legacy, default): a dropped bucket's table is left", n, want)
	}
	for _, id := range []string{"parked", "held", "dead", "late"} {
		if n := count(`SELECT count(*) FROM onceflow.inbox_legacy WHERE consumer = 'default' AND event_id = $1`, id); n != 1 {
			t.Errorf("%s: %d rows in the legacy partition, want 1 (kept out of the expired bucket)", id, n)
		}
	}
	for _, id := range []string{"fresh", "kept-permanent", "kept-720h"} {
		if n := count(`SELECT count(*) FROM onceflow.inbox WHERE consumer = 'default' AND event_id = $1`, id); n != 1 {
			t.Errorf("%s: %d rows, want 1", id, n)
		}
	}
	if n := count(`SELECT count(*) FROM onceflow.inbox WHERE consumer = 'other'`); n != 1 {
		t.Errorf("the other consumer's row: %d, want 1", n)
	}
	if n := count(`SELECT count(*) FROM onceflow.inbox WHERE consumer = 'default' AND event_id LIKE 'old-%'`); n != 0 {
		t.Errorf("%d expired rows left", n)
	}
	// A later pass prunes the kept rows only once they are processed, row
	// by row in the legacy partition (the late one never).
	exec(`UPDATE onceflow.inbox SET status = 'processed' WHERE consumer = 'default' AND event_id = 'parked'`)
	if st, err = retention.Prune(ctx, db.Pool, r, retention.Options{}); err != nil || st.Inbox != 1 {
		t.Fatalf("second pass: %+v, %v; want the replayed parked row", st, err)
	}

	// ping.moved's lane was recorded under ping.*'s 1h; the policy now
	// keeps it permanently: its lane's buckets are kept.
	exec(`SELECT onceflow.inbox_ensure_buckets('default', 'ttl-3600s', now() - interval '10 hours')`)
	ins("moved-1", "ping.moved", "processed", false, "10 hours")
	moved, err := retention.Parse([]byte(`{"classes": [{"match": "ping.moved", "keep": "permanent"}, {"match": "ping.*", "keep": "1h"}, {"match": "*", "keep": "720h"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if st, err = retention.Prune(ctx, db.Pool, moved, retention.Options{}); err != nil || st.InboxBuckets != 0 {
		t.Fatalf("after the policy change: %+v, %v; want no bucket removed", st, err)
	}
	if n := count(`SELECT count(*) FROM onceflow.inbox WHERE event_id = 'moved-1'`); n != 1 {
		t.Fatalf("moved-1: %d rows, want 1", n)
	}
}

// TestPruneEffectBuckets: an expired effects bucket of a consumer is
// removed whole (truncated, then dropped) once its end is older than the
// policy's longest TTL and a bucket width, after the rows retention keeps
// moved to the legacy partition: an intent, a held effect, a done row
// without an event, and a done row whose event still has an inbox row (a
// permanent class). Done rows whose inbox row is gone go with the bucket.
// The kept keys are still found by a claim (done replays its result, held
// is refused, the intent is claimed again); another consumer's bucket of
// the same time and the consumer's current bucket keep every row.
func TestPruneEffectBuckets(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	// The longest TTL is 24h: buckets of 3 hours, expired once they ended
	// more than 27 hours ago.
	r, err := retention.Parse([]byte(`{"classes": [{"match": "pay.*", "keep": "permanent"}, {"match": "*", "keep": "24h"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	o := retention.Options{Consumer: "c1"}
	if _, err := retention.Prune(ctx, db.Pool, r, o); err != nil {
		t.Fatal(err)
	}
	if n := count(`SELECT count(*) FROM onceflow.effects_buckets WHERE owner = 'inbox/c1/'`); n != 2 {
		t.Fatalf("%d effects buckets after the first pass, want the current and the next", n)
	}
	// pay.x's event is kept for good in the inbox.
	exec(`SELECT onceflow.inbox_lane('c1', 'pay.x')`)
	exec(`SELECT onceflow.inbox_ensure_buckets('c1', 'permanent')`)
	exec(`INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status, lane)
	      VALUES ('c1', 'e-perm', 'src', 'pay.x', 't', 0, 0, 'processed', 'permanent')`)

	scope := effects.ConsumerScope("c1", "http", "pay")
	exec(`SELECT onceflow.effects_ensure_buckets('inbox/c1/', 86400, now() - interval '3 days')`)
	exec(`SELECT onceflow.effects_ensure_buckets('inbox/c2/', 86400, now() - interval '3 days')`)
	ins := func(owner, scope, key, event, status string, ago string) {
		t.Helper()
		exec(`INSERT INTO onceflow.effects (owner, scope, idempotency_key, event_id, status, attempts, result_code, result, held_reason, created_at)
		      VALUES ($1, $2, $3, NULLIF($4, ''), $5, 1, CASE WHEN $5 = 'done' THEN 200 + length($3) END,
		              CASE WHEN $5 = 'done' THEN jsonb_build_object('key', $3) END, CASE WHEN $5 = 'held' THEN 'past the window' END,
		              now() - $6::interval)`, owner, scope, key, event, status, ago)
	}
	ins("inbox/c1/", scope, "done-gone", "e-gone", "done", "3 days")
	ins("inbox/c1/", scope, "done-perm", "e-perm", "done", "3 days")
	ins("inbox/c1/", scope, "intent", "e-intent", "intent", "3 days")
	ins("inbox/c1/", scope, "held", "e-held", "held", "3 days")
	ins("inbox/c1/", scope, "no-event", "", "done", "3 days")
	ins("inbox/c1/", scope, "fresh", "e-fresh", "done", "1 minute")
	ins("inbox/c2/", effects.ConsumerScope("c2", "http", "pay"), "other", "e-other", "done", "3 days")
	exec(`INSERT INTO onceflow.effects (owner, scope, idempotency_key, event_id, status, attempts, result_code, created_at)
	      SELECT 'inbox/c1/', $1, 'bulk-' || g, 'e-bulk-' || g, 'done', 1, 200, now() - interval '3 days'
	        FROM generate_series(1, 1000) g`, scope)
	var old string
	if err := db.Pool.QueryRow(ctx, `SELECT e.tableoid::regclass::text FROM onceflow.effects e WHERE e.idempotency_key = 'done-gone'`).Scan(&old); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(old, "onceflow.effects_b_") {
		t.Fatalf("the old rows lie in %s, not in a bucket", old)
	}

	st, err := retention.Prune(ctx, db.Pool, r, o)
	if err != nil {
		t.Fatal(err)
	}
	// The bucket of 3 days ago and the next one made with it (empty).
	if st.EffectsBuckets != 2 || st.EffectsKept != 4 || st.BucketsBusy != 0 {
		t.Fatalf("pruned %+v, want 2 effects buckets, 4 rows kept", st)
	}
	if n := count(`SELECT count(*) FROM pg_class WHERE oid = to_regclass($1)`, old); n != 0 {
		t.Errorf("the expired bucket's table %s is still there", old)
	}
	if n := count(`SELECT count(*) FROM onceflow.effects_buckets WHERE owner = 'inbox/c1/' AND to_at < now() - interval '1 day'`); n != 0 {
		t.Errorf("%d expired buckets still recorded", n)
	}
	if n, want := count(`SELECT count(*) FROM pg_inherits WHERE inhparent = 'onceflow.effects'::regclass`),
		count(`SELECT count(*) + 2 FROM onceflow.effects_buckets`); n != want {
		t.Errorf("%d partitions, want %d (the buckets, legacy, default)", n, want)
	}
	for _, k := range []string{"done-perm", "intent", "held", "no-event"} {
		if n := count(`SELECT count(*) FROM onceflow.effects_legacy WHERE owner = '' AND scope = $1 AND idempotency_key = $2`, scope, k); n != 1 {
			t.Errorf("%s: %d rows in the legacy partition, want 1 (kept out of the expired bucket)", k, n)
		}
	}
	if n := count(`SELECT count(*) FROM onceflow.effects WHERE idempotency_key = 'done-gone' OR idempotency_key LIKE 'bulk-%'`); n != 0 {
		t.Errorf("%d done rows whose inbox row is gone are left", n)
	}
	for _, k := range []string{"fresh", "other"} {
		if n := count(`SELECT count(*) FROM onceflow.effects WHERE idempotency_key = $1`, k); n != 1 {
			t.Errorf("%s: %d rows, want 1", k, n)
		}
	}
	// No dead row versions: the expired rows went with their table.
	if n := count(`SELECT coalesce(sum(n_dead_tup), 0)::int FROM pg_stat_user_tables
	                WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'onceflow.effects'::regclass)`); n != 0 {
		t.Errorf("%d dead tuples in the ledger's partitions", n)
	}

	// The kept keys are found where they moved: done replays its result
	// (both protocols), held is refused, the intent is claimed again.
	for _, k := range []string{"done-perm", "no-event"} {
		c, err := effects.ClaimLease(ctx, db.Pool, scope, k, "", "me", time.Minute)
		if err != nil || c.Status != effects.StatusDone || c.Result.Code != 200+len(k) || !strings.Contains(string(c.Result.Summary), k) {
			t.Errorf("lease claim of %s: %+v, %v; want its recorded result", k, c, err)
		}
		var status string
		var code int
		if err := db.Pool.QueryRow(ctx, `SELECT status, result_code FROM onceflow.effect_claim($1, $2)`, k, scope).Scan(&status, &code); err != nil ||
			status != "done" || code != 200+len(k) {
			t.Errorf("session claim of %s: %s %d, %v; want done", k, status, code, err)
		}
	}
	if _, err := effects.ClaimLease(ctx, db.Pool, scope, "held", "e-held", "me", time.Minute); !errors.Is(err, effects.ErrHeld) {
		t.Errorf("claim of the held effect: %v, want ErrHeld", err)
	}
	if c, err := effects.ClaimLease(ctx, db.Pool, scope, "intent", "e-intent", "me", time.Minute); err != nil || c.Status != effects.StatusClaimed || c.Attempts != 2 {
		t.Errorf("claim of the intent: %+v, %v; want claimed, attempt 2", c, err)
	}
	if n := count(`SELECT count(*) FROM onceflow.effects WHERE scope = $1 AND idempotency_key IN ('done-perm', 'no-event', 'held', 'intent')`, scope); n != 4 {
		t.Errorf("%d rows of the kept keys after the claims, want 4", n)
	}
}
