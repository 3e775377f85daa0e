package itest

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// TestConsumerStartAt: a new consumer group started at a time applies only
// the records from that time on (record timestamps, not arrival), starting
// each stream at its first seq seen; the default reads the whole log.
func TestConsumerStartAt(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	topic := testkit.Topic(t, "start-at", 1, nil)
	cl := testkit.Client(t)
	t0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	var recs []*kgo.Record
	for seq := int64(1); seq <= 10; seq++ {
		ev := testEvent("acct-1", seq)
		r := ev.Record(topic)
		r.Timestamp = t0.Add(time.Duration(seq-6) * time.Minute) // seqs 6–10 at or after t0
		recs = append(recs, r)
	}
	produceRecords(t, cl, recs...)

	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t),
		ConsumerName: "from-t0", StartAt: inbox.StartAt(t0), FirstSeen: seqguard.AcceptFirstSeen})
	eventually(t, 30*time.Second, "seqs 6–10 applied", func() (bool, string) {
		p := e.metric("onceflow_consumer_processed_total")
		return p == 5, fmtState("processed", p)
	})
	e.stop(t)
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE consumer = 'from-t0' AND seq < 6`); n != 0 {
		t.Fatalf("%d events from before the start time applied", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE consumer = 'from-t0'`); n != 0 {
		t.Fatalf("%d gaps opened", n)
	}

	all := startEngine(t, inbox.Config{Pool: db.Pool, Group: "g2-" + topic, Topics: []string{topic}, BatchHandler: sqlHandler(t), ConsumerName: "all"})
	eventually(t, 30*time.Second, "the whole log applied", func() (bool, string) {
		p := all.metric("onceflow_consumer_processed_total")
		return p == 10, fmtState("processed", p)
	})
}

// TestStartAtNeedsAcceptFirstSeen: skipping the log's start with the
// default start policy is refused by name.
func TestStartAtNeedsAcceptFirstSeen(t *testing.T) {
	t.Parallel()
	cfg := inbox.Config{Group: "g", Topics: []string{"t"}, StartAt: inbox.StartLatest}.WithDefaults()
	var ce *inbox.ConfigError
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "StartAt" {
		t.Fatalf("StartLatest with ExpectFirstSeq1: %v, want a StartAt ConfigError", err)
	}
	cfg.FirstSeen = seqguard.AcceptFirstSeen
	if err := cfg.Validate(); err != nil {
		t.Fatalf("StartLatest with AcceptFirstSeen: %v", err)
	}
	for _, s := range []string{"earliest", "latest", "2026-12-01T00:00:00Z"} {
		p, err := inbox.ParseStartPosition(s)
		if err != nil || p.String() != s {
			t.Errorf("ParseStartPosition(%q) = %v, %v", s, p, err)
		}
	}
}
