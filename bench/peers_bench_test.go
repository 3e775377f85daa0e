package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/internal/migrate"
	"github.com/onceflow/onceflow/internal/pgtemp"
	"github.com/onceflow/onceflow/internal/testkit"
)

// BenchmarkPeers drains the same backlog (256 B events over 256 sources,
// already committed) with onceflow's relay and with two peers, on one
// PostgreSQL server and the test broker, one after the other in the same run,
// and prints onceflow's rate beside each peer's as a ratio:
//
//   - Watermill: watermill-sql v4's PostgreSQL outbox drained by Watermill's
//     forwarder through watermill-kafka v3 (bench/peers/watermill, a module
//     of its own), Watermill's defaults (SQL batch 100, sync producer);
//   - Debezium: the PostgreSQL connector (pgoutput) with the outbox
//     EventRouter on Kafka Connect standalone (jars from Maven Central via
//     tools/debezium/pom.xml, cached outside the tree). Its backlog is WAL:
//     Connect starts once to create the slot and publication, stops, the rows
//     are inserted, and Connect starts again and streams them.
//
// Debezium needs wal_level=logical. The shared test PostgreSQL is used when
// it has it; otherwise the benchmark starts its own throwaway server with it
// (internal/pgtemp) and runs every contender there, so they still share one
// server. Each rate runs from the first record visible in Kafka to the last
// (process start-up excluded; the notes give the rate from process start):
// from the last poll that saw no record yet to the first that saw all.
// Sizes: ONCEFLOW_BENCH_PEER_EVENTS (200k) for onceflow and Debezium,
// ONCEFLOW_BENCH_WATERMILL_EVENTS (50k) for Watermill.
func BenchmarkPeers(b *testing.B) {
	sz := benchSizes(b)
	benchReport.setSizes(sz)
	peers(b, benchReport, sz.PeerEvents, sz.WatermillEvents)
}

// drainResult is one contender's drain.
type drainResult struct {
	start, first, done time.Time
	n                  int
	cpu, rssMiB        float64
}

func (d drainResult) rate() float64 {
	if d.first.IsZero() { // no poll saw the topic empty
		d.first = d.start
	}
	return float64(d.n) / d.done.Sub(d.first).Seconds()
}
func (d drainResult) rateFromStart() float64 { return float64(d.n) / d.done.Sub(d.start).Seconds() }
func (d drainResult) note() string {
	return fmt.Sprintf("%d events; first record %s after process start, last %s later (%.0f ev/s from process start); process CPU %.1f s (%.1f s per 1M), peak RSS %.0f MiB",
		d.n, d.first.Sub(d.start).Round(time.Millisecond), d.done.Sub(d.first).Round(time.Millisecond), d.rateFromStart(), d.cpu, d.cpu/float64(d.n)*1e6, d.rssMiB)
}

func peers(tb testing.TB, rep *report, n, wmN int) {
	admin, where := logicalPostgres(tb)
	var wg sync.WaitGroup
	// Resolve and build the peers while onceflow runs.
	var dbzCP, wmBin string
	wg.Add(2)
	go func() { defer wg.Done(); dbzCP = debeziumClasspath(tb) }()
	go func() { defer wg.Done(); wmBin = watermillBinary(tb) }()

	record := rep.measure()
	mark := onceflowPeerDrain(tb, admin, n, false)
	record(figure{Name: "peers: onceflow relay drain, default (mark) mode", Value: mark.rate(), Unit: "events/s", Notes: []string{mark.note(), where}})
	record = rep.measure()
	del := onceflowPeerDrain(tb, admin, n, true)
	record(figure{Name: "peers: onceflow relay drain, -delete-on-publish", Value: del.rate(), Unit: "events/s", Notes: []string{del.note()}})
	wg.Wait()
	if tb.Failed() {
		return
	}

	record = rep.measure()
	wm := watermillDrain(tb, admin, wmBin, wmN)
	record(figure{Name: "peers: Watermill SQL forwarder + watermill-kafka drain", Value: wm.rate(), Unit: "events/s",
		Notes: []string{wm.note(), "watermill-sql v4 (PostgreSQL, SubscribeBatchSize 100, poll 10ms), forwarder component, watermill-kafka v3 sync publisher (Sarama)"}})
	record = rep.measure()
	dbz := debeziumDrain(tb, admin, dbzCP, n)
	record(figure{Name: "peers: Debezium Postgres connector + outbox EventRouter drain", Value: dbz.rate(), Unit: "events/s",
		Notes: []string{dbz.note(), "Debezium " + debeziumVersion + " (pgoutput, snapshot.mode no_data), Kafka Connect " + connectVersion + " standalone, producer defaults (linger 5ms), at-least-once, no Kafka transactions"}})

	rep.measure()(figure{Name: "peers: onceflow default mode vs Watermill", Value: mark.rate(), Unit: "events/s", CeilingName: "Watermill", Ceiling: wm.rate(),
		Target: ">= 5x", Met: met(mark.rate() >= 5*wm.rate())})
	rep.measure()(figure{Name: "peers: onceflow default mode vs Debezium", Value: mark.rate(), Unit: "events/s", CeilingName: "Debezium", Ceiling: dbz.rate(),
		Target: ">= 3x", Met: met(mark.rate() >= 3*dbz.rate())})
	rep.measure()(figure{Name: "peers: onceflow -delete-on-publish vs Debezium", Value: del.rate(), Unit: "events/s", CeilingName: "Debezium", Ceiling: dbz.rate()})
}

// logicalPostgres returns the admin URL of a server with wal_level=logical
// and a note saying which: the shared test server when it has it, else a
// throwaway server of the benchmark's own.
func logicalPostgres(tb testing.TB) (admin, note string) {
	tb.Helper()
	ctx := context.Background()
	shared := testkit.DatabaseURL(tb)
	conn, err := pgx.Connect(ctx, shared)
	if err != nil {
		tb.Fatalf("connect to test PostgreSQL: %v", err)
	}
	var level string
	err = conn.QueryRow(ctx, `SHOW wal_level`).Scan(&level)
	conn.Close(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if level == "logical" {
		return shared, "on the shared test PostgreSQL (wal_level=logical)"
	}
	c, err := pgtemp.StartWithOptions(ctx, pgtemp.Options{Settings: map[string]string{
		"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4",
		"shared_buffers": "256MB", "max_connections": "200",
	}})
	if err != nil {
		tb.Fatalf("the shared test PostgreSQL has wal_level=%s and a throwaway server with wal_level=logical did not start: %v", level, err)
	}
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Logf("stop throwaway PostgreSQL: %v", err)
		}
	})
	return c.URL, fmt.Sprintf("on the benchmark's own PostgreSQL with wal_level=logical (the shared one has %s), every contender on it", level)
}

// newDBOn creates a migrated database on the server at admin and drops it
// on cleanup.
func newDBOn(tb testing.TB, admin string) (string, *pgxpool.Pool) {
	tb.Helper()
	ctx := context.Background()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "bench_peer_" + hex.EncodeToString(rnd[:])
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatal(err)
	}
	u := testkit.WithDatabase(admin, name)
	tb.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			tb.Logf("drop %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Logf("drop %s: %v", name, err)
		}
	})
	mc, err := pgx.Connect(ctx, u)
	if err != nil {
		tb.Fatal(err)
	}
	_, _, err = migrate.Up(ctx, mc)
	mc.Close(ctx)
	if err != nil {
		tb.Fatalf("migrate %s: %v", name, err)
	}
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return u, pool
}

// onceflowPeerDrain drains n bulk-inserted rows with the relay binary.
func onceflowPeerDrain(tb testing.TB, admin string, n int, deleteOnPublish bool) drainResult {
	ctx := context.Background()
	u, pool := newDBOn(tb, admin)
	topic := testkit.Topic(tb, "bench-peer-onceflow", benchPartitions, nil)
	ckpt := testkit.Topic(tb, "bench-peer-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	if _, err := pool.Exec(ctx, `
		INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, payload)
		SELECT 'ev-' || g, $1, 'src-' || (g % 256), g / 256 + 1, 'bench.event', 'application/json',
		       convert_to('{"pad":"' || repeat('x', $3 - 10) || '"}', 'UTF8')
		  FROM generate_series(0, $2 - 1) g`, topic, n, benchPayload); err != nil {
		tb.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE onceflow.outbox`); err != nil {
		tb.Fatal(err)
	}
	args := []string{"run", "-database-url", u, "-kafka-brokers", testkit.KafkaBrokers(tb), "-checkpoint-topic", ckpt,
		"-transactional-id-prefix", "bench-" + topic + "-", "-http-addr", "127.0.0.1:0"}
	if deleteOnPublish {
		args = append(args, "-delete-on-publish")
	}
	res := drainResult{n: n, start: time.Now()}
	p := testkit.Start(tb, "relay", testkit.Binary(tb, "relay"), nil, args...)
	addr := httpAddr(tb, p)
	for {
		v, err := scrape(addr, "onceflow_relay_published_total")
		now := time.Now()
		if err == nil && v == 0 {
			res.first = now // the last poll before the first record: the drain starts after it
		}
		if err == nil && v >= float64(n) {
			res.done = now
			break
		}
		if p.Exited() || now.Sub(res.start) > 30*time.Minute {
			tb.Fatalf("relay published %v of %d (%v)\n%s", v, n, err, p.Output())
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
	res.cpu, res.rssMiB = cpuOf(p.Cmd.Process.Pid), vmHWM(tb, p.Cmd.Process.Pid)
	stopProc(tb, p)
	return res
}

// waitTopic polls the sum of topic's end offsets every 20ms until it
// reaches n and fills first and done; exited reports a contender that died.
func waitTopic(tb testing.TB, topic string, n int, res *drainResult, exited func() bool, output func() string) {
	tb.Helper()
	adm := kadm.NewClient(testkit.Client(tb))
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		offs, err := adm.ListEndOffsets(ctx, topic)
		cancel()
		now := time.Now()
		var sum int64
		if err == nil {
			offs.Each(func(o kadm.ListedOffset) { sum += o.Offset })
		}
		if sum == 0 {
			res.first = now // the last poll before the first record
		}
		if sum >= int64(n) {
			res.done = now
			return
		}
		if exited() || now.Sub(res.start) > 30*time.Minute {
			tb.Fatalf("topic %s has %d of %d records (%v)\n%s", topic, sum, n, err, output())
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}
}

// watermillBinary builds bench/peers/watermill once per test process.
var wmBuild struct {
	once sync.Once
	path string
	err  error
}

func watermillBinary(tb testing.TB) string {
	wmBuild.once.Do(func() {
		root, err := testkit.RepoRoot()
		if err != nil {
			wmBuild.err = err
			return
		}
		dir, err := os.MkdirTemp("", "onceflow-bench-watermill-")
		if err != nil {
			wmBuild.err = err
			return
		}
		wmBuild.path = filepath.Join(dir, "watermill-forwarder")
		cmd := exec.Command("go", "build", "-o", wmBuild.path, ".")
		cmd.Dir = filepath.Join(root, "bench", "peers", "watermill")
		// A module of its own, outside the repository's workspace (go.work):
		// Watermill's dependencies stay out of every other module.
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			wmBuild.err = fmt.Errorf("go build bench/peers/watermill: %v\n%s", err, out)
		}
	})
	if wmBuild.err != nil {
		tb.Error(wmBuild.err)
		return ""
	}
	return wmBuild.path
}

func watermillDrain(tb testing.TB, admin, bin string, n int) drainResult {
	u, _ := newDBOn(tb, admin)
	topic := testkit.Topic(tb, "bench-peer-watermill", benchPartitions, nil)
	fill := exec.Command(bin, "fill", "-database-url", u, "-topic", topic, "-n", fmt.Sprint(n), "-payload", fmt.Sprint(benchPayload))
	if out, err := fill.CombinedOutput(); err != nil {
		tb.Fatalf("watermill fill: %v\n%s", err, out)
	}
	res := drainResult{n: n, start: time.Now()}
	p := testkit.Start(tb, "watermill", bin, nil, "forward", "-database-url", u, "-brokers", testkit.KafkaBrokers(tb))
	waitTopic(tb, topic, n, &res, p.Exited, p.Output)
	res.cpu, res.rssMiB = cpuOf(p.Cmd.Process.Pid), vmHWM(tb, p.Cmd.Process.Pid)
	stopProc(tb, p)
	return res
}

// The Debezium and Kafka Connect versions of tools/debezium/pom.xml.
const (
	debeziumVersion = "3.6.3.Final"
	connectVersion  = "4.1.1"
)

var dbzJars struct {
	once sync.Once
	cp   string
	err  error
}

// debeziumClasspath resolves tools/debezium/pom.xml's jars with mvn into a
// cache outside the tree, keyed by the pom's hash (first run only).
func debeziumClasspath(tb testing.TB) string {
	dbzJars.once.Do(func() {
		root, err := testkit.RepoRoot()
		if err != nil {
			dbzJars.err = err
			return
		}
		pom := filepath.Join(root, "tools", "debezium", "pom.xml")
		b, err := os.ReadFile(pom)
		if err != nil {
			dbzJars.err = err
			return
		}
		sum := sha256.Sum256(b)
		cache := os.Getenv("ONCEFLOW_CACHE_DIR")
		if cache == "" {
			if cache, err = os.UserCacheDir(); err != nil {
				dbzJars.err = err
				return
			}
			cache = filepath.Join(cache, "onceflow")
		}
		lib := filepath.Join(cache, "debezium-lib-"+hex.EncodeToString(sum[:])[:12])
		dbzJars.cp = filepath.Join(lib, "*")
		if _, err := os.Stat(filepath.Join(lib, ".complete")); err == nil {
			return
		}
		mvn, err := exec.LookPath("mvn")
		if err != nil {
			dbzJars.err = fmt.Errorf("mvn not found: install the Debian package 'maven' (it resolves Debezium and Kafka Connect from Maven Central)")
			return
		}
		_ = os.RemoveAll(lib)
		cmd := exec.Command(mvn, "-B", "-q", "dependency:copy-dependencies", "-DincludeScope=runtime", "-DoutputDirectory="+lib)
		cmd.Dir = filepath.Dir(pom)
		if out, err := cmd.CombinedOutput(); err != nil {
			dbzJars.err = fmt.Errorf("mvn could not resolve tools/debezium/pom.xml: %v\n%s", err, lastLines(string(out), 20))
			return
		}
		dbzJars.err = os.WriteFile(filepath.Join(lib, ".complete"), nil, 0o644)
	})
	if dbzJars.err != nil {
		tb.Error(dbzJars.err)
	}
	return dbzJars.cp
}

func cfgDatabase(tb testing.TB, u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		tb.Fatal(err)
	}
	return cfg.Database
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

func debeziumDrain(tb testing.TB, admin, cp string, n int) drainResult {
	ctx := context.Background()
	dbz := newDebezium(tb, admin, cp)
	// First start: the connector creates its slot and publication and
	// streams (nothing yet); it is stopped once the slot is in use.
	p := dbz.start()
	dbz.waitActive(p)
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(2 * time.Minute); err != nil {
		p.Kill()
	}
	// The backlog: committed while Debezium is down, retained by its slot.
	if _, err := dbz.pool.Exec(ctx, `
		INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), $1, 'src-' || (g % 256), 'bench.event', convert_to('{"pad":"' || repeat('x', $3 - 10) || '"}', 'UTF8')
		  FROM generate_series(0, $2 - 1) g`, dbz.topic, n, benchPayload); err != nil {
		tb.Fatal(err)
	}
	res := drainResult{n: n, start: time.Now()}
	p = dbz.start()
	waitTopic(tb, dbz.topic, n, &res, p.Exited, p.Output)
	res.cpu, res.rssMiB = cpuTree(p.Cmd.Process.Pid), vmHWM(tb, p.Cmd.Process.Pid)
	dbz.stop(p)
	return res
}

// debezium is a Debezium PostgreSQL connector with the outbox EventRouter,
// on Kafka Connect standalone, set up for one new database on the server at
// admin: the outbox table public.outbox (Debezium's default columns) routed
// to topic (aggregatetype holds the topic's name; aggregateid is the record
// key; the row's id arrives in the record header "id"). extra are more
// connector properties ("key=value").
type debezium struct {
	tb    testing.TB
	url   string
	pool  *pgxpool.Pool
	slot  string
	topic string
	dir   string
	cp    string
}

func newDebezium(tb testing.TB, admin, cp string, extra ...string) *debezium {
	ctx := context.Background()
	u, pool := newDBOn(tb, admin)
	d := &debezium{tb: tb, url: u, pool: pool, cp: cp, dir: tb.TempDir(),
		slot: "onceflow_bench_" + strings.TrimPrefix(cfgDatabase(tb, u), "bench_peer_")}
	// Cleanups run last-first: the slot is dropped before the database.
	tb.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, d.slot)
	})
	// The outbox table of Debezium's outbox pattern, one primary key.
	if _, err := pool.Exec(ctx, `CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload bytea NOT NULL)`); err != nil {
		tb.Fatal(err)
	}
	d.topic = testkit.Topic(tb, "bench-peer-debezium", benchPartitions, nil)
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		tb.Fatal(err)
	}
	worker := strings.Join([]string{
		"bootstrap.servers=" + testkit.KafkaBrokers(tb),
		"key.converter=org.apache.kafka.connect.storage.StringConverter",
		"value.converter=org.apache.kafka.connect.converters.ByteArrayConverter",
		"offset.storage.file.filename=" + filepath.Join(d.dir, "offsets"),
		"offset.flush.interval.ms=1000",
		"listeners=http://127.0.0.1:0",
	}, "\n") + "\n"
	connector := strings.Join(append([]string{
		"name=onceflow-bench-debezium",
		"connector.class=io.debezium.connector.postgresql.PostgresConnector",
		"tasks.max=1",
		"plugin.name=pgoutput",
		"database.hostname=" + cfg.Host,
		fmt.Sprintf("database.port=%d", cfg.Port),
		"database.user=" + cfg.User,
		"database.password=unused",
		"database.dbname=" + cfg.Database,
		"topic.prefix=onceflowbench",
		"table.include.list=public.outbox",
		"slot.name=" + d.slot,
		"publication.name=" + d.slot,
		"publication.autocreate.mode=filtered",
		"snapshot.mode=no_data",
		"tombstones.on.delete=false",
		"transforms=outbox",
		"transforms.outbox.type=io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.route.topic.replacement=${routedByValue}",
	}, extra...), "\n") + "\n"
	for name, body := range map[string]string{"worker.properties": worker, "connector.properties": connector} {
		if err := os.WriteFile(filepath.Join(d.dir, name), []byte(body), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return d
}

// start starts Kafka Connect with the connector.
func (d *debezium) start() *testkit.Proc {
	java := os.Getenv("ONCEFLOW_JAVA")
	if java == "" {
		java = "java"
	}
	return testkit.Start(d.tb, "connect", java, nil, "-Xmx1g", "-cp", d.cp, "org.apache.kafka.connect.cli.ConnectStandalone",
		filepath.Join(d.dir, "worker.properties"), filepath.Join(d.dir, "connector.properties"))
}

// waitActive returns once the connector's replication slot is in use (it
// streams from then on), or fails the test after five minutes or when the
// process exits.
func (d *debezium) waitActive(p *testkit.Proc) {
	for deadline := time.Now().Add(5 * time.Minute); ; {
		var active bool
		err := d.pool.QueryRow(context.Background(), `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1`, d.slot).Scan(&active)
		if err == nil && active {
			return
		}
		if p.Exited() || time.Now().After(deadline) {
			d.tb.Fatalf("debezium: slot %s not active (%v)\n%s", d.slot, err, p.Output())
		}
		time.Sleep(100 * time.Millisecond) // polling a condition
	}
}

// stop stops Kafka Connect (SIGTERM, the JVM's exit status 143 expected).
func (d *debezium) stop(p *testkit.Proc) {
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(60 * time.Second); err != nil && !strings.Contains(err.Error(), "exit status 143") {
		d.tb.Logf("connect: %v", err)
	}
}
