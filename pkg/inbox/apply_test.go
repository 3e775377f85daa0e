package inbox

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// scriptedGuard answers from a table keyed by event id (default: apply).
type scriptedGuard struct {
	verdicts map[string]verdict
	seen     []string
}

func (g *scriptedGuard) Admit(_ context.Context, _ pgx.Tx, consumer string, ev Event) (verdict, error) {
	if consumer != "c1" {
		return verdict{}, fmt.Errorf("consumer %q", consumer)
	}
	g.seen = append(g.seen, ev.EventID)
	if ev.EventID == "boom" {
		return verdict{}, errors.New("guard store down")
	}
	return g.verdicts[ev.EventID], nil
}

type recorder struct{ got []Event }

func (r *recorder) HandleBatch(_ context.Context, _ pgx.Tx, evs []Event) error {
	r.got = append(r.got, evs...)
	return nil
}

type applySetup struct {
	db    *testkit.DB
	app   *applier
	guard *scriptedGuard
	rec   *recorder
}

func setupApply(t *testing.T) applySetup {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	db := testkit.NewDB(t)
	g := &scriptedGuard{verdicts: map[string]verdict{}}
	r := &recorder{}
	cfg := Config{Pool: db.Pool, Group: "g", ConsumerName: "c1", guard: g}.WithDefaults()
	return applySetup{db: db, app: &applier{cfg: &cfg, handler: r}, guard: g, rec: r}
}

func rec(id string, seq, offset int64) *kgo.Record {
	ev := envelope.Envelope{EventID: id, Source: "s", Seq: seq, EventType: "t", Payload: []byte(`{}`)}
	r := ev.Record("topic")
	r.Offset = offset
	return r
}

func items(recs ...*kgo.Record) []item {
	out := make([]item, len(recs))
	for i, r := range recs {
		out[i] = decodeItem(r, 0)
	}
	return out
}

// TestApplyGuardSeam drives the sequence-guard seam with a scripted guard:
// park and hold keep the row and its payload without calling the handler,
// apply-late flags the event and the row, and released parked events run
// after the event that released them and become processed.
func TestApplyGuardSeam(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t)

	// Offsets 0..2: e3 arrives first and is parked, e4 held, e1 late.
	s.guard.verdicts["e3"] = verdict{Action: actPark}
	s.guard.verdicts["e4"] = verdict{Action: actHold}
	s.guard.verdicts["e1"] = verdict{Action: actApplyLate}
	out, err := s.app.applyTx(ctx, items(rec("e3", 3, 0), rec("e4", 4, 1), rec("e1", 1, 2)))
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 1 || len(s.rec.got) != 1 || s.rec.got[0].EventID != "e1" || !s.rec.got[0].Late {
		t.Fatalf("after the first batch: processed %d, handler saw %+v", out.processed, s.rec.got)
	}
	// e2 arrives and releases e3 (as the seqguard store would, from the row).
	parked := items(rec("e3", 3, 0))[0].ev
	s.guard.verdicts["e2"] = verdict{Action: actApply, Then: []Event{parked}}
	out, err = s.app.applyTx(ctx, items(rec("e2", 2, 3), rec("e3", 3, 4)))
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 2 || out.duplicates != 1 {
		t.Fatalf("second batch: %+v", out)
	}
	var order []string
	for _, ev := range s.rec.got {
		order = append(order, ev.EventID)
	}
	if fmt.Sprint(order) != "[e1 e2 e3]" {
		t.Fatalf("handler order %v", order)
	}
	want := map[string]string{"e1": "processed true false", "e2": "processed false false", "e3": "processed false false", "e4": "held false true"}
	rows, err := s.db.Pool.Query(ctx, `SELECT event_id, status, late, payload IS NOT NULL FROM onceflow.inbox WHERE consumer = 'c1'`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id, status string
		var late, kept bool
		if err := rows.Scan(&id, &status, &late, &kept); err != nil {
			t.Fatal(err)
		}
		got[id] = fmt.Sprintf("%s %v %v", status, late, kept)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("inbox rows %v\nwant %v", got, want)
	}
	// A guard error aborts the whole batch as infrastructure trouble.
	_, err = s.app.applyTx(ctx, items(rec("e5", 5, 5), rec("boom", 6, 6)))
	var he *HandlerError
	if err == nil || errors.As(err, &he) {
		t.Fatalf("guard error gave %v, want a non-handler error", err)
	}
	var n int
	if err := s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.inbox WHERE event_id = 'e5'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("e5 rows %d err %v: the batch was not rolled back", n, err)
	}
	var next int64
	if err := s.db.Pool.QueryRow(ctx, `SELECT next_offset FROM onceflow.consumer_offsets WHERE group_id = 'g'`).Scan(&next); err != nil || next != 5 {
		t.Fatalf("next offset %d err %v, want 5", next, err)
	}
}

// TestApplyIsolatedDeadLetters: a failing event is tried RetryMaxAttempts
// times and dead-lettered; its neighbours are applied.
func TestApplyIsolatedDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := setupApply(t)
	s.app.cfg.RetryMaxAttempts = 3
	s.app.cfg.RetryInitialInterval, s.app.cfg.RetryMaxInterval = 1, 1
	tries := 0
	s.app.handler = asBatch(HandlerFunc(func(_ context.Context, _ pgx.Tx, ev Event) error {
		if ev.EventID == "bad" {
			tries++
			return errors.New("nope")
		}
		return nil
	}))
	errs := 0
	out, err := s.app.applyIsolated(ctx, items(rec("a", 1, 0), rec("bad", 2, 1), rec("c", 3, 2)), nil, func(error) { errs++ })
	if err != nil {
		t.Fatal(err)
	}
	if out.processed != 2 || out.dead != 1 || tries != 3 || errs != 3 {
		t.Fatalf("out %+v, tries %d, errors %d", out, tries, errs)
	}
	var status, lastErr string
	var attempts int
	if err := s.db.Pool.QueryRow(ctx, `SELECT status, attempts, last_error FROM onceflow.inbox WHERE event_id = 'bad'`).Scan(&status, &attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if status != "dead" || attempts != 3 || lastErr != "nope" {
		t.Fatalf("dead letter: %s %d %q", status, attempts, lastErr)
	}
	// Replay with a fixed handler applies it once.
	res, err := Replay(ctx, s.db.Pool, "c1", s.rec, "bad")
	if err != nil || res != Replayed {
		t.Fatalf("replay: %v %v", res, err)
	}
	if res, err := Replay(ctx, s.db.Pool, "c1", s.rec, "bad"); err != nil || res != AlreadyProcessed {
		t.Fatalf("second replay: %v %v", res, err)
	}
	if len(s.rec.got) != 1 || s.rec.got[0].EventID != "bad" || s.rec.got[0].Seq != 2 {
		t.Fatalf("replayed %+v", s.rec.got)
	}
	if _, err := Replay(ctx, s.db.Pool, "c1", s.rec, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("replay of an unknown id: %v", err)
	}
}
