package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/audit"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// On a real broker the reader sees committed records only (an aborted
// transaction's never), reads to the last stable offset, and the Sequence
// finds the duplicate, the reordering and the malformed record.
func TestTopicReaderOnKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs Kafka")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := testkit.Topic(t, "audit", 2, nil)
	ev := func(id, src string, seq int64) *kgo.Record {
		e := envelope.Envelope{EventID: id, Source: src, Seq: seq, EventType: "t", Payload: []byte(`{}`)}
		return e.Record(topic)
	}
	txn := testkit.Client(t, kgo.TransactionalID("audit-"+topic), kgo.DefaultProduceTopic(topic))
	for _, commit := range []bool{true, false} {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		recs := []*kgo.Record{ev("a1", "a", 1), ev("a2", "a", 2), ev("a2", "a", 2)}
		if !commit {
			recs = []*kgo.Record{ev("x1", "x", 1)}
		}
		if err := txn.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		end := kgo.TryCommit
		if !commit {
			end = kgo.TryAbort
		}
		if err := txn.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
	plain := testkit.Client(t)
	if err := plain.ProduceSync(ctx, ev("a0", "a", 1), &kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("no headers")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	seq := audit.NewSequence()
	var bad []string
	r, err := audit.NewTopicReader(topic, func(rec audit.Record) {
		if rec.Err != nil {
			bad = append(bad, rec.Err.Error())
			return
		}
		seq.Add(rec.Env.EventID, rec.Env.Source, rec.Env.Seq)
	}, kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(t), ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.ReadToStable(ctx); err != nil {
		t.Fatal(err)
	}
	lost, dup, phantom := seq.Diff(map[string]bool{"a0": true, "a1": true, "a2": true})
	if len(lost) != 0 || len(phantom) != 0 || len(dup) != 1 || dup[0] != "a2" {
		t.Errorf("lost %v, duplicated %v, phantom %v; want only a2 duplicated", lost, dup, phantom)
	}
	if seq.Count["x1"] != 0 {
		t.Error("the aborted transaction's record was read")
	}
	if len(seq.OutOfOrder) != 1 || !strings.Contains(seq.OutOfOrder[0], "a: seq 1 after seq 2") {
		t.Errorf("out of order %v", seq.OutOfOrder)
	}
	if len(bad) != 1 {
		t.Errorf("malformed %v, want the record without headers", bad)
	}
}
