package inbox

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// streamRec is a record of source src's event seq of type typ.
func streamRec(id, src, typ string, seq, offset int64) *kgo.Record {
	ev := envelope.Envelope{EventID: id, Source: src, Seq: seq, EventType: typ, Payload: []byte(`{}`)}
	r := ev.Record("topic")
	r.Offset = offset
	return r
}

// TestBatchDoesNotWaitForAnotherConsumersRetention: many services share one
// database. While another consumer name's bucket is locked (its retention
// pass truncating it), batches of this consumer's events, sequence guard
// and all, go through: the guard reads the streams' parked rows from this
// consumer's partitions only (seqguard.PGStore.LockIn), parks an event
// ahead of a gap in the lane its inbox row was inserted to
// (seqguard.Event.Lane), and un-parks it from the consumer's lanes when
// the gap fills; the gap timer gives a gap up and releases the event
// behind it from the same lanes. The store's Lock, which reads every
// partition, waits for that lock: the test can tell.
func TestBatchDoesNotWaitForAnotherConsumersRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	const lane = "ttl-86400s"
	for _, c := range []string{s.app.cfg.ConsumerName, "other"} {
		if _, err := s.db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox_lanes (consumer, event_type, lane) VALUES ($1, 't', $2)`, c, lane); err != nil {
			t.Fatal(err)
		}
		if _, err := s.db.Pool.Exec(ctx, `SELECT onceflow.inbox_ensure_buckets($1, $2)`, c, lane); err != nil {
			t.Fatal(err)
		}
	}
	var theirs string
	if err := s.db.Pool.QueryRow(ctx, `SELECT relname FROM onceflow.inbox_buckets WHERE consumer = 'other' ORDER BY from_at LIMIT 1`).Scan(&theirs); err != nil {
		t.Fatal(err)
	}
	holder, err := s.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck // released below
	if _, err := holder.Exec(ctx, `LOCK TABLE onceflow.`+pgx.Identifier{theirs}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	quick, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The guard reads the streams' parked rows at each batch.
	for i, batch := range [][]*kgo.Record{
		{streamRec("e1", "s", "t", 1, 1)},
		{streamRec("e2", "s", "t", 2, 2), streamRec("f1", "f", "t", 1, 3)},
		{streamRec("e3", "s", "t", 3, 4)},
		{streamRec("e5", "s", "t", 5, 5)}, // parked: 4 is missing
		{streamRec("e4", "s", "t", 4, 6)}, // e4, then e5 un-parked
	} {
		if i == 4 {
			// (Read with constants, from this consumer's lane: a read by
			// consumer and event id alone would wait for the lock too.)
			var parked string
			if err := s.db.Pool.QueryRow(quick, `SELECT status FROM onceflow.inbox WHERE lane = $1 AND consumer = $2 AND event_id = 'e5'`,
				pgx.QueryExecModeSimpleProtocol, lane, s.app.cfg.ConsumerName).Scan(&parked); err != nil || parked != "parked" {
				t.Fatalf("e5 is %q (%v), want parked", parked, err)
			}
		}
		if _, err := s.app.applyTx(quick, items(batch...)); err != nil {
			t.Fatalf("batch %d under another consumer's bucket lock: %v", i+1, err)
		}
	}
	var got []string
	for _, ev := range s.rec.got {
		got = append(got, ev.EventID)
	}
	if !slices.Equal(got, []string{"e1", "e2", "f1", "e3", "e4", "e5"}) {
		t.Fatalf("handled %v, want e1 e2 f1 e3 e4 e5", got)
	}
	// f3 waits behind a gap at 2; the timer, an hour later, gives it up.
	if _, err := s.app.applyTx(quick, items(streamRec("f3", "f", "t", 3, 7))); err != nil {
		t.Fatalf("f3 under another consumer's bucket lock: %v", err)
	}
	gone, err := s.app.giveUpExpired(quick, s.app.guard.(*seqGuard), time.Now().Add(time.Hour), nil)
	if err != nil || gone.processed != 1 || len(gone.guard.givenUp) != 1 {
		t.Fatalf("gap timer under another consumer's bucket lock: %+v %v", gone, err)
	}
	if last := s.rec.got[len(s.rec.got)-1]; last.EventID != "f3" {
		t.Fatalf("handled %v last, want f3 released", last.EventID)
	}
	// The store's Lock reads every partition: it waits.
	waitsFor(t, s.db.Pool, theirs, holder, "PGStore.Lock", func() error {
		tx, err := s.db.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck // read only
		store := &seqguard.PGStore{Consumer: s.app.cfg.ConsumerName}
		_, err = store.Lock(ctx, tx, []seqguard.Stream{{Source: "s"}}, time.Now())
		return err
	})
}

// TestParkedRowInALaneThisReplicaHasNotMet: another replica of the same
// consumer name recorded a lane and parked an event there after this
// replica read its lanes (it reads them again each minute). The parked row
// is outside the lanes this replica's guard reads first; the guard sees
// that the consumer has a lane it did not read, reads every partition, and
// releases the parked event when the gap fills.
func TestParkedRowInALaneThisReplicaHasNotMet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t, nil)
	consumer := s.app.cfg.ConsumerName
	// This replica reads its lanes: legacy and permanent only.
	if _, err := s.app.applyTx(ctx, items(streamRec("warm", "w", "a", 1, 1))); err != nil {
		t.Fatal(err)
	}
	// The other replica: the lane of type b, and event 3 parked in it.
	const lane = "ttl-86400s"
	if _, err := s.db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox_lanes (consumer, event_type, lane) VALUES ($1, 'b', $2)`, consumer, lane); err != nil {
		t.Fatal(err)
	}
	other := &applier{cfg: s.app.cfg, handler: s.rec, guard: newSeqGuard(s.app.cfg)}
	if _, err := other.applyTx(ctx, items(streamRec("e3", "s", "b", 3, 2))); err != nil {
		t.Fatal(err)
	}
	var at, status string
	if err := s.db.Pool.QueryRow(ctx, `SELECT lane, status FROM onceflow.inbox WHERE consumer = $1 AND event_id = 'e3'`, consumer).Scan(&at, &status); err != nil {
		t.Fatal(err)
	}
	if at != lane || status != "parked" {
		t.Fatalf("e3 is %s in lane %s, want parked in %s", status, at, lane)
	}
	if probe, err := s.app.lanes.probeLanes(ctx, s.db.Pool, consumer); err != nil || slices.Contains(probe, lane) {
		t.Fatalf("this replica's lanes %v (%v): the test needs them without %s", probe, err, lane)
	}
	// This replica fills the gap with events of type a.
	out, err := s.app.applyTx(ctx, items(streamRec("e1", "s", "a", 1, 3), streamRec("e2", "s", "a", 2, 4)))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range s.rec.got {
		got = append(got, ev.EventID)
	}
	if !slices.Equal(got, []string{"warm", "e1", "e2", "e3"}) || out.processed != 3 {
		t.Fatalf("handled %v (%+v), want warm e1 e2 e3: the parked event is released", got, out)
	}
}
