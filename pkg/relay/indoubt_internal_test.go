package relay

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
)

func TestDecideInDoubt(t *testing.T) {
	t.Parallel()
	const pid = 7
	rec := func(id int64, topic string, partition int32, offset int64) inDoubtRecord {
		return inDoubtRecord{id: id, topic: topic, partition: partition, offset: offset, pid: pid}
	}
	d := &inDoubtBatch{
		rows: []inDoubtRecord{rec(1, "t", 0, 10), rec(2, "t", 1, 20), rec(3, "t", 0, 11)},
		ckpt: rec(0, "c", 0, 5),
	}
	m := func(p int64, offset int64, commit bool) pidMarker {
		return pidMarker{pid: p, offset: offset, commit: commit}
	}
	cases := []struct {
		name    string
		markers map[string]map[int32][]pidMarker
		want    string // settlement, or the error's start
		split   bool
	}{
		{"committed everywhere", map[string]map[int32][]pidMarker{
			"t": {0: {m(pid, 12, true)}, 1: {m(pid, 21, true)}}, "c": {0: {m(pid, 6, true)}},
		}, "3 rows committed, 0 aborted, checkpoint committed", false},
		{"aborted everywhere", map[string]map[int32][]pidMarker{
			"t": {0: {m(pid, 12, false)}, 1: {m(pid, 21, false)}}, "c": {0: {m(pid, 6, false)}},
		}, "0 rows committed, 3 aborted, checkpoint aborted", false},
		{"the soak's split: data committed, checkpoint aborted", map[string]map[int32][]pidMarker{
			"t": {0: {m(pid, 12, true)}, 1: {m(pid, 21, true)}}, "c": {0: {m(pid, 6, false)}},
		}, "3 rows committed, 0 aborted, checkpoint aborted", true},
		{"the other split: checkpoint committed, one partition aborted", map[string]map[int32][]pidMarker{
			"t": {0: {m(pid, 12, true)}, 1: {m(pid, 21, false)}}, "c": {0: {m(pid, 6, true)}},
		}, "2 rows committed, 1 aborted, checkpoint committed", true},
		{"another producer's markers and this one's earlier ones do not count", map[string]map[int32][]pidMarker{
			"t": {0: {m(pid, 9, false), m(8, 12, false), m(pid, 13, true)}, 1: {m(8, 21, false), m(pid, 22, true)}},
			"c": {0: {m(pid, 4, false), m(pid, 6, true)}},
		}, "3 rows committed, 0 aborted, checkpoint committed", false},
		{"undecided in one partition", map[string]map[int32][]pidMarker{
			"t": {0: {m(pid, 12, true)}, 1: {m(8, 21, true)}}, "c": {0: {m(pid, 6, true)}},
		}, "record t[1]@20 (producer id 7): its transaction is not decided", false},
	}
	for _, tc := range cases {
		s, err := decide(d, tc.markers)
		got := s.String()
		if err != nil {
			got = err.Error()
		}
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
		if err == nil && s.split() != tc.split {
			t.Errorf("%s: split %v, want %v", tc.name, s.split(), tc.split)
		}
	}
}

// A batch whose commit outcome was unknown is settled by its own records
// against a real broker: a transaction that committed in the data
// partitions and aborted in the checkpoint partition (what Kafka 4.1.1 did
// in a soak run when a transaction coordinator was killed mid-commit) is
// built from two transactions of one producer, whose records together make
// the batch: row 1 committed, row 2 and the checkpoint aborted, row 3
// committed. Recovery must mark rows 1 and 3 published and leave row 2 to be
// published again, although no checkpoint names any of them; the split is
// counted.
func TestRecoverSettlesAnInDoubtBatchByItsRecords(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs Kafka")
	}
	ctx, db, data, seeds, cfg := recoverEnv(t, 2)

	var ids []int64
	for i := range 3 {
		var id int64
		if err := db.Pool.QueryRow(ctx, `
INSERT INTO onceflow.outbox (event_id, topic, source, seq, event_type, content_type, payload)
VALUES ($1, $2, 'src', $3, 'test.event', 'application/json', '{}') RETURNING id`, fmt.Sprintf("ev-%d", i+1), data, i+1).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}

	cl, err := kgo.NewClient(seeds, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionalID(fmt.Sprintf("indoubt-%d", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	txn := func(commit kgo.TransactionEndTry, recs ...*kgo.Record) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	r1 := &kgo.Record{Topic: data, Partition: 0, Value: []byte("1")}
	r3 := &kgo.Record{Topic: data, Partition: 1, Value: []byte("3")}
	txn(kgo.TryCommit, r1, r3)
	r2 := &kgo.Record{Topic: data, Partition: 0, Value: []byte("2")}
	ck := &kgo.Record{Topic: cfg.CheckpointTopic, Partition: 0, Key: []byte("not-this-relays"), Value: []byte("v2 ")}
	txn(kgo.TryAbort, r2, ck)
	d := newInDoubt([]*kgo.Record{r1, r2, r3, ck}, map[*kgo.Record]int64{r1: ids[0], r2: ids[1], r3: ids[2]})
	if d == nil {
		t.Fatal("records acknowledged but not recorded as in doubt")
	}

	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r := &recoverer{cfg: cfg, log: slog.New(slog.DiscardHandler), m: m}
	prod, err := r.recover(ctx, slog.New(slog.DiscardHandler), d)
	if err != nil {
		t.Fatal(err)
	}
	prod.cl.Close()
	if prod.recovered.marked != 2 {
		t.Errorf("recovery marked %d rows, want 2", prod.recovered.marked)
	}
	rows, err := db.Pool.Query(ctx, `SELECT id FROM onceflow.outbox_pending ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var pending []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		pending = append(pending, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pending, []int64{ids[1]}) {
		t.Errorf("pending after recovery: %v, want only row %d (its record aborted)", pending, ids[1])
	}
	if n := testutil.ToFloat64(m.errors.WithLabelValues(errKindSplit)); n != 1 {
		t.Errorf("split transactions counted %v, want 1", n)
	}
}

// A batch in doubt that cannot be settled by its records (here a record in
// a partition the topic does not have, as after the topic was deleted and
// made again) fails recovery, which is retried, until inDoubtPatience has
// passed since the commit failed; then recovery settles it by the
// checkpoint alone and says so, rather than stop publishing for good.
func TestRecoverGivesUpSettlingByRecords(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs Kafka")
	}
	ctx, _, data, _, cfg := recoverEnv(t, 1)
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	r := &recoverer{cfg: cfg, log: log}
	d := &inDoubtBatch{
		rows: []inDoubtRecord{{id: 1, topic: data, partition: 7, offset: 0, pid: 1}},
		ckpt: inDoubtRecord{topic: cfg.CheckpointTopic, partition: 0, offset: 0, pid: 1},
		at:   time.Now(),
	}
	if _, err := r.recover(ctx, log, d); err == nil || !strings.Contains(err.Error(), "settle the batch whose commit outcome was unknown") {
		t.Fatalf("recovery within the patience: %v, want the settlement's error", err)
	}
	d.at = time.Now().Add(-inDoubtPatience - time.Second)
	prod, err := r.recover(ctx, log, d)
	if err != nil {
		t.Fatalf("recovery past the patience: %v", err)
	}
	prod.cl.Close()
	if !strings.Contains(logs.String(), "could not be settled by its records: settled by the checkpoint alone") {
		t.Errorf("the fallback was not logged:\n%s", logs.String())
	}
}

// recoverEnv is a recovery's world: a database, a data topic of partitions
// partitions, the brokers' seeds and a Config with its own checkpoint topic.
func recoverEnv(t *testing.T, partitions int32) (context.Context, *testkit.DB, string, kgo.Opt, Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	db := testkit.NewDB(t)
	data := testkit.Topic(t, "relay-indoubt", partitions, nil)
	seeds := kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(t), ",")...)
	cfg := Config{DB: db.Pool, KafkaOpts: []kgo.Opt{seeds}, CheckpointTopic: testkit.Topic(t, "relay-indoubt-ckpt", 1, nil),
		Shard: "default", TransactionTimeout: 10 * time.Second}.WithDefaults()
	return ctx, db, data, seeds, cfg
}
