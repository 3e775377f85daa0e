// Package soak is onceflow's chaos soak (`make soak`): the real relay (two
// replicas) and consumer (two replicas) binaries against a three-broker
// KRaft cluster and a PostgreSQL server of its own, producers writing
// through both enqueue paths (outbox.Enqueue in Go and the SQL function
// onceflow.enqueue) with rollbacks and long transactions, and a seeded
// fault schedule: relays and consumers SIGKILLed and paused, brokers killed
// hard (the leader of an event partition, of the checkpoint partition, the
// transaction coordinator, the group coordinator) and restarted, PostgreSQL
// stopped with -m immediate and started, connections cut or stalled
// through loopback TCP proxies that the binaries connect through.
//
// The run ends with a report (text, JSON and a PNG plot of the lag) that
// judges the database and a read_committed read of the topic: events lost,
// duplicated, reordered, phantom (never committed), sequence gaps given up
// though nothing was missing. Report.OK is true only with zero anomalies.
package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	deploysql "github.com/onceflow/onceflow/deploy/sql"
	"github.com/onceflow/onceflow/internal/kafkanode"
	"github.com/onceflow/onceflow/internal/pgtemp"
	"github.com/onceflow/onceflow/internal/procs"
	"github.com/onceflow/onceflow/internal/tcpproxy"
	"github.com/onceflow/onceflow/internal/topics"
)

// Config of a soak run. The zero value of each field means its default.
type Config struct {
	// BinDir holds the relay and consumer binaries (required).
	BinDir string
	// Command replays the run; it is printed in the report (default none).
	Command string
	// DrainTimeout bounds the wait, after producing stops, for every
	// committed event to be applied (default 10m).
	DrainTimeout time.Duration
	// Duration of the producing phase, faults included (default 10m).
	Duration time.Duration
	// EssentialGrace is how long the producing phase may outlast Duration
	// for every essential fault kind to be injected (default 3m).
	EssentialGrace time.Duration
	// FaultInterval is the mean pause between one fault's recovery and
	// the next fault (default 4s).
	FaultInterval time.Duration
	// Kinds limits the fault kinds (default: all of AllKinds).
	Kinds []string
	// OutDir receives report.txt, report.json, lag.png and logs/
	// (required).
	OutDir string
	// Out receives the progress lines (default os.Stdout).
	Out io.Writer
	// OutageScale multiplies every fault's outage (default 1): a short run
	// (the test) uses short outages to fit every essential fault in.
	OutageScale float64
	// Rate is the offered load in events per second, probes included
	// (default 320: above 1M events an hour after the outages).
	Rate int
	// RecoveryTimeout bounds the wait for progress after one fault
	// (default 2m); a fault that exceeds it is reported as a stall.
	RecoveryTimeout time.Duration
	// Seed replays the fault schedule and the producers' choices
	// (default: time-based).
	Seed uint64
	// ServicesScript is scripts/services.sh, asked for the Kafka jars
	// (default "scripts/services.sh").
	ServicesScript string
	// SnapshotHold is how long each producing database's REPEATABLE READ
	// snapshot is held before the next one replaces it (default 3m).
	SnapshotHold time.Duration
	// Writers is the number of producer goroutines (default 6).
	Writers int
}

// WithDefaults fills the zero fields.
func (c Config) WithDefaults() Config {
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Minute
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Minute
	}
	if c.EssentialGrace == 0 {
		c.EssentialGrace = 3 * time.Minute
	}
	if c.FaultInterval == 0 {
		c.FaultInterval = 4 * time.Second
	}
	if len(c.Kinds) == 0 {
		c.Kinds = AllKinds
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Rate == 0 {
		c.Rate = 320
	}
	if c.OutageScale == 0 {
		c.OutageScale = 1
	}
	if c.RecoveryTimeout == 0 {
		c.RecoveryTimeout = 2 * time.Minute
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.ServicesScript == "" {
		c.ServicesScript = "scripts/services.sh"
	}
	if c.Writers == 0 {
		c.Writers = 6
	}
	if c.SnapshotHold == 0 {
		c.SnapshotHold = 3 * time.Minute
	}
	return c
}

func (c Config) validate() error {
	if c.BinDir == "" {
		return errors.New("soak: BinDir is required")
	}
	if c.OutDir == "" {
		return errors.New("soak: OutDir is required")
	}
	if c.Duration < 0 || c.Rate < 0 || c.FaultInterval < 0 || c.Writers < 0 || c.OutageScale < 0 {
		return errors.New("soak: Duration, Rate, FaultInterval, Writers and OutageScale must not be negative")
	}
	for _, k := range c.Kinds {
		if !validKind(k) {
			return fmt.Errorf("soak: unknown fault kind %q (want one of %v)", k, AllKinds)
		}
	}
	return nil
}

// The topology: two producing databases, a (the database the consumers
// apply to as well) and b, writing the same source names to both event
// topics; a has two relay replicas, b one; two consumer names with
// different handlers read both topics: soak (two replicas) records each
// applied event, soak-tally (one) also keeps a per-stream counter.
//
// Database b is fed by logical replication: b's producers write into the
// outbox of a source database on a PostgreSQL server of its own (the
// publisher, wal_level=logical, which no fault touches), a subscription in
// b applies the rows, and b's relay publishes them from b's outbox.
const (
	eventTopic  = "onceflow.events"
	eventTopic2 = "onceflow.events.orders"
	ckptTopic   = "onceflow.relay.checkpoints"
	group       = "onceflow-soak"
	consumerID  = "soak"
	tallyGroup  = "onceflow-soak-tally"
	tallyID     = "soak-tally"
	dbA, dbB    = "a", "b"
	dbBName     = "soak_b"
	// The publication on b's source database and the subscription in b.
	pubName, subName = "soak_outbox", "soak_b_outbox"
)

var (
	eventTopics = []string{eventTopic, eventTopic2}
	relays      = []string{"relay-a", "relay-b", "relay-2a"}
	consumers   = []string{"consumer-a", "consumer-b", "tally-a"}
	// relayDB is the producing database each relay publishes.
	relayDB = map[string]string{"relay-a": dbA, "relay-b": dbA, "relay-2a": dbB}
	// consumerNames are the logical consumers, each with its own group.
	consumerNames = []string{consumerID, tallyID}
)

// prodDB is one producing database.
type prodDB struct {
	name string        // dbA or dbB
	url  string        // direct, past the proxy
	pool *pgxpool.Pool // the database its relay publishes
	// srcPool is the source database whose outbox a subscription
	// replicates into this one (database b), else nil: the producers
	// write there.
	srcPool *pgxpool.Pool
	prod    *producer
	// snap holds the REPEATABLE READ snapshots in pool (the relay's
	// database); it is prod unless the producers write elsewhere.
	snap *producer
}

type run struct {
	cfg   Config
	start time.Time
	logs  string
	work  string // broker and database data, removed at the end

	// pg is the server the producing databases live on (the primary),
	// standby its streaming standby (pg-switchover only, else nil); a
	// switchover swaps them. pgNodes are both, for the teardown.
	pg, standby *pgtemp.Cluster
	pgNodes     []*pgtemp.Cluster
	// src is the publisher of database b's outbox: a server of its own
	// with wal_level=logical, untouched by the faults.
	src     *pgtemp.Cluster
	pgProxy *tcpproxy.Proxy
	pool    *pgxpool.Pool // database a, direct, past the proxy
	dbs     []*prodDB     // a and b
	// identities maps each producing database's identity (the producer
	// of its streams) to its name.
	identities map[string]string
	kc         *cluster
	adm        *kadm.Client // past the proxies
	admCl      *kgo.Client
	procs      *procs.Set

	led    *ledger
	prod   *producer
	probes *probes
	topic  *topicWatch

	faultsMu  sync.Mutex
	faults    []Fault
	held      sync.Map // child name -> struct{}: down or paused on purpose
	exitsMu   sync.Mutex
	exits     []string // children that ended without being told to
	series    *series
	current   atomic.Pointer[string] // the fault in progress, for the progress line
	loadStart string
	// unavailable are the fault kinds this machine cannot inject, and why.
	unavailable map[string]string
}

// brokerDiskSize is the size of the tmpfs that holds one broker's data (the
// disk-full fault): room for an hour's run; only what is written takes
// memory.
const brokerDiskSize = 8 << 30

// Run executes the soak. The error is about the soak itself (a binary
// missing, a broker that does not start); what the run found is in the
// report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	for _, b := range []string{"relay", "consumer"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("binary %s: %w (run `make build` first)", b, err)
		}
	}
	r := &run{cfg: cfg, logs: filepath.Join(cfg.OutDir, "logs"), led: newLedger(), series: &series{}, unavailable: map[string]string{}}
	if err := os.MkdirAll(r.logs, 0o755); err != nil {
		return nil, err
	}
	var err error
	if r.work, err = os.MkdirTemp("", "onceflow-soak-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(r.work)
	r.printf("onceflow soak: %s at %d events/s, a fault every ~%s after recovery (seed %d)\n",
		cfg.Duration, cfg.Rate, cfg.FaultInterval, cfg.Seed)
	defer r.teardown()
	if err := r.setup(ctx); err != nil {
		return nil, err
	}
	return r.execute(ctx)
}

func (r *run) printf(format string, a ...any) { fmt.Fprintf(r.cfg.Out, format, a...) }

func (r *run) elapsed() time.Duration { return time.Since(r.start) }

func (r *run) setup(ctx context.Context) error {
	t0 := time.Now()
	var err error
	// Kafka (three JVMs) starts while PostgreSQL starts and is migrated.
	type started struct {
		kc           *cluster
		diskErr, err error
		retried      error // the first try's error, when the cluster was started twice
	}
	kafkaCh := make(chan started, 1)
	var diskSize int64
	if slices.Contains(r.cfg.Kinds, KindBrokerDiskFull) {
		diskSize = brokerDiskSize
	}
	go func() {
		peers := slices.Contains(r.cfg.Kinds, KindBrokerPartition) || slices.Contains(r.cfg.Kinds, KindBrokerCtrlPartition)
		kc, diskErr, err := startCluster(ctx, r.cfg.ServicesScript, filepath.Join(r.work, "kafka"), diskSize, peers)
		var retried error
		if errors.Is(err, kafkanode.ErrExitedDuringStart) {
			// A broker whose JVM ended while starting (seen once in CI: a
			// NullPointerException in Kafka's own startup, its log gone
			// with the run) is not the soak's subject: the whole cluster is
			// started once more, on new ports and in a new directory (the
			// first one's logs stay).
			if kc != nil {
				kc.stop()
			}
			retried = err
			kc, diskErr, err = startCluster(ctx, r.cfg.ServicesScript, filepath.Join(r.work, "kafka-again"), diskSize, peers)
		}
		kafkaCh <- started{kc, diskErr, err, retried}
	}()
	kafkaJoined := false
	joinKafka := func() started {
		kafkaJoined = true
		k := <-kafkaCh
		r.kc = k.kc // stopped by teardown
		if k.retried != nil {
			r.printf("  kafka      a broker exited while the cluster started; started it again: %v\n", k.retried)
		}
		return k
	}
	defer func() {
		if !kafkaJoined {
			joinKafka()
		}
	}()
	// PostgreSQL, and the proxy the binaries reach it through.
	settings := map[string]string{"max_connections": "300", "log_min_messages": "warning"}
	switchover := slices.Contains(r.cfg.Kinds, KindPGSwitchover)
	if switchover {
		maps.Copy(settings, pgtemp.StandbySettings())
	}
	if r.pg, err = pgtemp.StartWithOptions(ctx, pgtemp.Options{Settings: settings, StopWithProcess: true}); err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	r.pgNodes = append(r.pgNodes, r.pg)
	// The soak's own pools connect directly; with a standby, to whichever
	// of the two accepts writes (libpq's target_session_attrs, which pgx
	// follows), so that they find the new primary after a switchover.
	urlFor := func(db string) string {
		return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", r.pg.Port, db)
	}
	if switchover {
		// Asynchronous streaming replication: a clean switchover checks
		// that the standby has the primary's last WAL record before it
		// promotes it (docs/reliability.md, "pg-switchover").
		if r.standby, err = r.pg.StartStandby(ctx, pgtemp.Options{StopWithProcess: true}); err != nil {
			return fmt.Errorf("start the PostgreSQL standby: %w", err)
		}
		r.pgNodes = append(r.pgNodes, r.standby)
		a, b := r.pg.Port, r.standby.Port
		urlFor = func(db string) string {
			return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write", a, b, db)
		}
	}
	if r.pgProxy, err = tcpproxy.Listen("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", r.pg.Port)); err != nil {
		return err
	}
	urlA := urlFor("postgres")
	pc, err := pgxpool.ParseConfig(urlA)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(r.cfg.Writers + 8)
	// The writers deadlock on purpose now and then (events of several
	// sources locked in random order); detect it quickly.
	pc.ConnConfig.RuntimeParams["deadlock_timeout"] = "50ms"
	if r.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return err
	}
	// Database b: a second producing database in the same server.
	if _, err := r.pool.Exec(ctx, "CREATE DATABASE "+dbBName); err != nil {
		return fmt.Errorf("create database %s: %w", dbBName, err)
	}
	urlB := urlFor(dbBName)
	pcB, err := pgxpool.ParseConfig(urlB)
	if err != nil {
		return err
	}
	pcB.MaxConns = pc.MaxConns
	pcB.ConnConfig.RuntimeParams["deadlock_timeout"] = "50ms"
	poolB, err := pgxpool.NewWithConfig(ctx, pcB)
	if err != nil {
		return err
	}
	dB := &prodDB{name: dbB, url: urlB, pool: poolB}
	r.dbs = []*prodDB{{name: dbA, url: urlA, pool: r.pool}, dB}
	// Database b's source: the publisher, a server of its own, so that
	// neither a switchover (logical slots do not move to a physical
	// standby in PostgreSQL 15) nor a restart of the producing databases'
	// server touches the slot. The subscription in b connects to it
	// directly.
	if r.src, err = pgtemp.StartWithOptions(ctx, pgtemp.Options{StopWithProcess: true,
		Settings: map[string]string{"wal_level": "logical", "max_connections": "100", "log_min_messages": "warning"}}); err != nil {
		return fmt.Errorf("start b's source PostgreSQL: %w", err)
	}
	pcS, err := pgxpool.ParseConfig(r.src.URL)
	if err != nil {
		return err
	}
	pcS.MaxConns = pc.MaxConns
	pcS.ConnConfig.RuntimeParams["deadlock_timeout"] = "50ms"
	if dB.srcPool, err = pgxpool.NewWithConfig(ctx, pcS); err != nil {
		return err
	}
	standby := ""
	if r.standby != nil {
		standby = fmt.Sprintf(", streaming standby on :%d", r.standby.Port)
	}
	r.printf("  postgres   %s and database %s%s (binaries through proxy %s); %s fed by logical replication from :%d; up at %s\n",
		redact(urlA), dbBName, standby, r.pgProxy.Addr(), dbBName, r.src.Port, time.Since(t0).Round(100*time.Millisecond))

	// Schema and the side-effect tables.
	for _, d := range append(append([]*prodDB{}, r.dbs...), &prodDB{name: "b's source", url: r.src.URL}) {
		out, err := r.binCmd(ctx, "relay", "migrate", "-database-url", d.url)
		if err != nil {
			return fmt.Errorf("relay migrate (database %s): %w: %s", d.name, err, out)
		}
	}
	if err := subscribe(ctx, dB.srcPool, poolB, r.src.Port); err != nil {
		return err
	}
	r.identities = map[string]string{}
	for _, d := range r.dbs {
		var id string
		if err := d.pool.QueryRow(ctx, `SELECT id::text FROM onceflow.database_identity`).Scan(&id); err != nil {
			return fmt.Errorf("identity of database %s: %w", d.name, err)
		}
		r.identities[id] = d.name
	}
	if _, err := r.pool.Exec(ctx, effectsDDL); err != nil {
		return fmt.Errorf("create soak.effects: %w", err)
	}
	r.printf("  schema     the databases migrated, b subscribed to its source at %s\n", time.Since(t0).Round(100*time.Millisecond))

	// Kafka: three brokers, each behind a proxy.
	k := joinKafka()
	if k.err != nil {
		return fmt.Errorf("start Kafka cluster: %w", k.err)
	}
	if k.diskErr != nil {
		r.unavailable[KindBrokerDiskFull] = k.diskErr.Error()
		r.printf("  fault %s left out: %v\n", KindBrokerDiskFull, k.diskErr)
	}
	if r.admCl, err = kgo.NewClient(r.kc.internalOpts()...); err != nil {
		return err
	}
	r.adm = kadm.NewClient(r.admCl)
	r.printf("  kafka      3 brokers (KRaft), binaries through proxies %v, up at %s\n", r.kc.externalSeeds(), time.Since(t0).Round(100*time.Millisecond))

	// Topics as the contract ships them.
	spec, err := topics.Default()
	if err != nil {
		return err
	}
	// The second event topic, with the first one's contract.
	for _, t := range spec.Topics {
		if t.Name == eventTopic {
			t.Name = eventTopic2
			spec.Topics = append(spec.Topics, t)
			break
		}
	}
	// Freshly created topics reach every broker's metadata a moment later:
	// apply again until the verification after it passes.
	for attempt := 1; ; attempt++ {
		_, err := topics.Apply(ctx, r.adm, spec)
		if err == nil {
			break
		}
		if attempt == 20 || ctx.Err() != nil {
			return fmt.Errorf("create topics: %w", err)
		}
		time.Sleep(time.Second)
	}
	if err := r.kc.waitTopics(ctx, eventTopic, eventTopic2, ckptTopic); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.work, "handlers.json"), []byte(handlersJSON), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.work, "tally.json"), []byte(tallyJSON), 0o644); err != nil {
		return err
	}
	parts, err := r.partitions(ctx)
	if err != nil {
		return err
	}
	r.probes = newProbes(eventTopic, parts)
	for i, d := range r.dbs {
		d.prod = &producer{pool: d.pool, led: r.led, db: d.name, topics: eventTopics, seed: r.cfg.Seed + uint64(i)*7919, hard: ctx}
		d.snap = d.prod
		if d.srcPool != nil {
			d.prod.pool = d.srcPool
			d.snap = &producer{pool: d.pool, led: r.led, db: d.name}
		}
	}
	r.prod = r.dbs[0].prod
	if r.topic, err = newTopicWatch(eventTopics, r.kc.internalOpts()); err != nil {
		return err
	}
	r.topic.producers = r.identities
	if r.procs, err = procs.NewSet(r.logs); err != nil {
		return err
	}
	r.printf("  topics     %s and %s (%d partitions, RF 3, min ISR 2), %s; set up in %s\n",
		eventTopic, eventTopic2, parts, ckptTopic, time.Since(t0).Round(time.Second))
	return nil
}

// effectsDDL is the side effect the consumers apply: one row per applied
// event and consumer name, no unique constraint, so a double apply shows as
// two rows; and soak-tally's per-stream counter, which a double apply
// moves past the ledger's count.
const effectsDDL = `
CREATE SCHEMA soak;
CREATE TABLE soak.effects (
    n               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text        NOT NULL,
    producer        text        NOT NULL,
    topic           text        NOT NULL,
    event_id        text        NOT NULL,
    source          text        NOT NULL,
    seq             bigint      NOT NULL,
    late            boolean     NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    applied_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX effects_source_seq ON soak.effects (source, seq);
CREATE TABLE soak.tally (
    producer text   NOT NULL,
    topic    text   NOT NULL,
    source   text   NOT NULL,
    n        bigint NOT NULL,
    max_seq  bigint NOT NULL,
    PRIMARY KEY (producer, topic, source)
);`

// The two consumer names' handlers. :payload.db is the producing database
// the producers write into every payload.
const (
	handlersJSON = `{"handlers": [{"event_type": "*", "kind": "sql", "sql":
  "INSERT INTO soak.effects (consumer, producer, topic, event_id, source, seq, late, kafka_partition, kafka_offset) VALUES ('soak', :payload.db, :topic, :event_id, :source, :seq, :late, :partition, :offset)"}]}`
	tallyJSON = `{"handlers": [{"event_type": "*", "kind": "sql", "sql":
  "WITH t AS (INSERT INTO soak.tally AS t (producer, topic, source, n, max_seq) VALUES (:payload.db, :topic, :source, 1, :seq) ON CONFLICT (producer, topic, source) DO UPDATE SET n = t.n + 1, max_seq = greatest(t.max_seq, excluded.max_seq)) INSERT INTO soak.effects (consumer, producer, topic, event_id, source, seq, late, kafka_partition, kafka_offset) VALUES ('soak-tally', :payload.db, :topic, :event_id, :source, :seq, :late, :partition, :offset)"}]}`
)

func (r *run) partitions(ctx context.Context) (int, error) {
	m, err := r.adm.Metadata(ctx, eventTopic)
	if err != nil {
		return 0, err
	}
	t, ok := m.Topics[eventTopic]
	if !ok || t.Err != nil {
		return 0, fmt.Errorf("metadata of %s: %v", eventTopic, t.Err)
	}
	return len(t.Partitions), nil
}

func (r *run) binCmd(ctx context.Context, bin string, args ...string) (string, error) {
	out, err := commandOutput(ctx, filepath.Join(r.cfg.BinDir, bin), args...)
	return out, err
}

// childSpec is how relay-a, consumer-b, … run: through the proxies.
func (r *run) childSpec(name string) procs.Spec {
	dbURL := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", r.pgProxy.Addr())
	brokers := joinComma(r.kc.externalSeeds())
	if strings.HasPrefix(name, "relay") {
		if relayDB[name] == dbB {
			dbURL = fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", r.pgProxy.Addr(), dbBName)
		}
		return procs.Spec{Bin: filepath.Join(r.cfg.BinDir, "relay"), Args: []string{"run",
			"-database-url", dbURL, "-kafka-brokers", brokers, "-http-addr", "127.0.0.1:0",
			"-holder-id", name, "-topics-verify"}}
	}
	grp, cname, handlers := group, consumerID, "handlers.json"
	if strings.HasPrefix(name, "tally") {
		grp, cname, handlers = tallyGroup, tallyID, "tally.json"
	}
	return procs.Spec{Bin: filepath.Join(r.cfg.BinDir, "consumer"), Args: []string{"run",
		"-database-url", dbURL, "-kafka-brokers", brokers, "-http-addr", "127.0.0.1:0",
		"-group", grp, "-topics", joinComma(eventTopics), "-consumer-name", cname,
		"-instance-id", name, "-handlers-file", filepath.Join(r.work, handlers)}}
}

// execute runs the producing phase with faults, drains, and judges.
func (r *run) execute(ctx context.Context) (*Report, error) {
	for _, name := range append(append([]string{}, relays...), consumers...) {
		if _, err := r.procs.Start(name, r.childSpec(name)); err != nil {
			return nil, err
		}
	}
	r.start = time.Now()
	r.loadStart = loadAvg()
	bg, stopBG := context.WithCancel(ctx)
	defer stopBG()
	var bgWG sync.WaitGroup
	goBG := func(f func(context.Context)) {
		bgWG.Add(1)
		go func() { defer bgWG.Done(); f(bg) }()
	}
	goBG(r.topic.run)
	goBG(func(ctx context.Context) { r.probes.watch(ctx, r.pool) })
	goBG(r.sample)
	goBG(r.superviseChildren)

	// The producing phase: writers, the long-transaction writer, probes,
	// and the faults.
	// It lasts Duration, and longer if the essential faults have not all
	// been injected by then (a short run on a slow machine), up to
	// EssentialGrace more.
	prodCtx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	essentialsDone := make(chan struct{})
	go func() {
		defer stopProducing()
		select {
		case <-time.After(r.cfg.Duration):
		case <-prodCtx.Done():
			return
		}
		select {
		case <-essentialsDone:
		case <-time.After(r.cfg.EssentialGrace):
		case <-prodCtx.Done():
		}
	}()
	var wg sync.WaitGroup
	perWriter := max(float64(r.cfg.Rate)-float64(len(r.probes.sources))/probeInterval.Seconds(), 1) / float64(r.cfg.Writers)
	for w := range r.cfg.Writers {
		// The writers alternate between the producing databases.
		p := r.dbs[w%len(r.dbs)].prod
		wg.Add(1)
		go func() { defer wg.Done(); p.runWriter(prodCtx, w, perWriter) }()
	}
	for _, d := range r.dbs {
		wg.Add(2)
		go func() { defer wg.Done(); d.prod.runLong(prodCtx) }()
		go func() { defer wg.Done(); d.snap.holdSnapshots(prodCtx, r.cfg.SnapshotHold) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); r.probes.run(prodCtx, r.prod, eventTopic) }()
	go func() { defer wg.Done(); r.injectFaults(prodCtx, essentialsDone) }()
	<-prodCtx.Done()
	wg.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	produced := r.elapsed()
	r.printf("producing stopped after %s (%d events committed); every process up again, draining…\n",
		produced.Round(time.Second), r.led.n.Load())
	r.healAll(ctx)
	drained, drainTime := r.drain(ctx)
	stopBG()
	bgWG.Wait()
	killed := r.procs.StopAll(30 * time.Second)
	rep, err := r.judge(ctx)
	if err != nil {
		return nil, err
	}
	rep.ProducingSeconds = produced.Seconds()
	rep.LoadStart, rep.LoadEnd = r.loadStart, loadAvg()
	rep.DrainSeconds = drainTime.Seconds()
	if rep.InDoubt, err = countInDoubt(r.logs); err != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("relay logs not read for commits in doubt: %v", err))
	}
	if !drained {
		rep.Notes = append(rep.Notes, fmt.Sprintf("not drained within %s: the anomalies below include what was still in flight", r.cfg.DrainTimeout))
	}
	for _, k := range killed {
		rep.Notes = append(rep.Notes, k+" did not exit within 30s of SIGTERM and was killed")
	}
	if err := r.writeReport(rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// healAll ends every fault: processes running and resumed, brokers and
// PostgreSQL up, proxies open.
func (r *run) healAll(ctx context.Context) {
	for _, name := range append(append([]string{}, relays...), consumers...) {
		r.procs.Resume(name)
		if _, err := r.procs.Restart(name); err != nil {
			r.printf("  restart %s: %v\n", name, err)
		}
		r.held.Delete(name)
	}
	r.pgProxy.Heal()
	for _, b := range r.kc.brokers {
		b.proxy.Heal()
		b.healPeers()
		if b.disk != "" {
			if err := resizeTmpfs(ctx, b.disk, brokerDiskSize); err != nil {
				r.printf("  %v\n", err)
			}
		}
	}
	if started, err := r.kc.ensureRunning(ctx); err != nil || len(started) > 0 {
		r.printf("  brokers started at the end: %v (%v)\n", started, err)
	}
}

// drain waits until every committed event is on the topic and applied.
func (r *run) drain(ctx context.Context) (bool, time.Duration) {
	t0 := time.Now()
	deadline := t0.Add(r.cfg.DrainTimeout)
	committed := int(r.led.n.Load())
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var applied, tallied int
		unpublished, err := r.unpublished(ctx)
		if err == nil {
			err = r.pool.QueryRow(ctx, `SELECT count(DISTINCT event_id) FILTER (WHERE consumer = $1),
				count(DISTINCT event_id) FILTER (WHERE consumer = $2) FROM soak.effects`, consumerID, tallyID).Scan(&applied, &tallied)
		}
		if err == nil && unpublished == 0 && applied >= committed && tallied >= committed && r.topic.distinct() >= committed {
			return true, time.Since(t0)
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	return false, time.Since(t0)
}

// unpublished counts the rows the relays still queue, in both databases.
func (r *run) unpublished(ctx context.Context) (int64, error) {
	var total int64
	for _, d := range r.dbs {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var n int64
		err := d.pool.QueryRow(qctx, `SELECT count(*) FROM onceflow.outbox_pending`).Scan(&n)
		cancel()
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// teardown stops everything the soak started, keeping the logs.
func (r *run) teardown() {
	if r.procs != nil {
		r.procs.StopAll(5 * time.Second)
	}
	if r.topic != nil {
		r.topic.close()
	}
	if r.admCl != nil {
		r.admCl.Close()
	}
	if r.kc != nil {
		for _, b := range r.kc.brokers {
			copyFile(filepath.Join(b.node.Dir, "server.log"), filepath.Join(r.logs, fmt.Sprintf("broker-%d.log", b.id)))
		}
		r.kc.stop()
	}
	for _, d := range r.dbs {
		if d.pool != r.pool {
			d.pool.Close()
		}
		if d.srcPool != nil {
			d.srcPool.Close()
		}
	}
	if r.pool != nil {
		r.pool.Close()
	}
	if r.pgProxy != nil {
		_ = r.pgProxy.Close()
	}
	for i, c := range r.pgNodes {
		name := "postgres.log"
		if i > 0 {
			name = fmt.Sprintf("postgres-%d.log", i+1)
		}
		copyFile(filepath.Join(c.Dir(), "postgres.log"), filepath.Join(r.logs, name))
		_ = c.Stop()
	}
	if r.src != nil {
		copyFile(filepath.Join(r.src.Dir(), "postgres.log"), filepath.Join(r.logs, "postgres-source-b.log"))
		_ = r.src.Stop()
	}
}

// subscribe makes database b (sub) a logical replica of its source's
// outbox: a publication of onceflow.outbox at the source, and a
// subscription in b that applies its rows from now on (copy_data = false:
// both outboxes are empty). The apply worker writes with
// session_replication_role = replica, so the outbox's statement-level
// queue trigger does not fire (and the apply worker fires no statement
// triggers at all); the row-level trigger of deploy/sql/subscriber.sql,
// enabled for replica sessions only, queues each applied row in the apply worker's own
// transaction, in the source's commit order, as the statement trigger
// does for local writers (docs/relay.md, "A producing database fed by
// logical replication"). Without it the relay's sweep would find the rows,
// but a late committer found by the full walk only may reach Kafka after
// its source's later events.
func subscribe(ctx context.Context, src, sub *pgxpool.Pool, srcPort int) error {
	if _, err := src.Exec(ctx, `CREATE PUBLICATION `+pubName+` FOR TABLE onceflow.outbox`); err != nil {
		return fmt.Errorf("create publication at b's source: %w", err)
	}
	if _, err := sub.Exec(ctx, deploysql.Subscriber); err != nil {
		return fmt.Errorf("queue trigger for replicated rows in b: %w", err)
	}
	_, err := sub.Exec(ctx, fmt.Sprintf(`CREATE SUBSCRIPTION %s CONNECTION 'host=127.0.0.1 port=%d dbname=postgres user=postgres' PUBLICATION %s WITH (copy_data = false)`,
		subName, srcPort, pubName))
	if err != nil {
		return fmt.Errorf("create subscription in b: %w", err)
	}
	return nil
}

// superviseChildren restarts a child that ended without being told to (as
// Kubernetes would) and notes it.
func (r *run) superviseChildren(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, name := range append(append([]string{}, relays...), consumers...) {
			if _, held := r.held.Load(name); held || r.procs.Running(name) {
				continue
			}
			if _, held := r.held.Load(name); held {
				continue
			}
			r.exitsMu.Lock()
			r.exits = append(r.exits, fmt.Sprintf("%s at %s: %v", name, r.elapsed().Round(time.Second), r.procs.Exit(name)))
			r.exitsMu.Unlock()
			r.printf("  %s exited by itself (%v): restarting\n", name, r.procs.Exit(name))
			_, _ = r.procs.Restart(name)
		}
		for _, b := range r.kc.brokers {
			name := fmt.Sprintf("broker-%d", b.id)
			if _, held := r.held.Load(name); held || b.node.Running() {
				continue
			}
			if _, held := r.held.Load(name); held {
				continue
			}
			r.exitsMu.Lock()
			r.exits = append(r.exits, fmt.Sprintf("%s at %s (see logs/%s.log)", name, r.elapsed().Round(time.Second), name))
			r.exitsMu.Unlock()
			r.printf("  %s exited by itself: restarting\n", name)
			if err := r.kc.restart(ctx, b.id); err != nil {
				r.printf("  restart %s: %v\n", name, err)
			}
		}
	}
}
