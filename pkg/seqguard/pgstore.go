package seqguard

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onceflow/onceflow/pkg/dbtx"
	"github.com/onceflow/onceflow/pkg/inbox/status"
)

// Querier is a PostgreSQL handle.
//
// Deprecated: use dbtx.DB.
type Querier = dbtx.DB

// Event is an event as the guard needs it. For the event passed to Receive
// EventID, Source and Seq are required, and Producer and Topic name its
// stream (StreamOf; Producer "" for a legacy stream's event); Headers and Payload are written to
// its inbox row if it is parked or held (nil leaves what the row holds, for
// a caller that writes them itself). Events returned from parking carry
// everything the inbox kept: with Topic, Partition, Offset, Headers and
// Payload the caller can rebuild and decode the original record.
type Event struct {
	EventID   string
	Source    string
	Producer  string
	Seq       int64
	EventType string
	Topic     string
	Partition int32
	Offset    int64
	// Headers as stored in the inbox's jsonb column.
	Headers json.RawMessage
	Payload []byte
	// Lane is the lane of the event's inbox row when that row was inserted
	// by the transaction the guard runs in (the inbox sets it for those
	// rows), so that its event_at is the transaction's time: parking the
	// event and marking it late then plan and lock that lane's partitions
	// of the consumer only and read only the row's bucket. Empty: they
	// look the row up in every partition of onceflow.inbox, every consumer
	// name's, and wait for any of them another session holds exclusively
	// (a retention pass truncating a bucket). A lane set for a row of an
	// earlier transaction finds no row: the park fails, naming the event.
	Lane string
}

// Stream is the event's stream.
func (e Event) Stream() Stream { return StreamOf(e.Producer, e.Topic, e.Source) }

// Apply is one handler run the caller owes, in order.
type Apply struct {
	Event Event
	// Late: the event's seq is at or below last_applied (its gap was given
	// up, or retention pruned its inbox row). The handler must be told.
	Late bool
	// Current: this is the event passed to Receive; otherwise it was parked
	// and its inbox row is now 'processed' with headers and payload cleared.
	Current bool
}

// Outcome is what the store did for one stream and what the caller must do.
type Outcome struct {
	Stream Stream
	// Steps are the state machine's decisions, already written to Postgres.
	// Tally them for the counters with Count.
	Steps []Step
	// Apply lists the handler runs the caller owes, in order, inside the
	// same transaction.
	Apply []Apply
}

// GivenUp returns the gaps given up in this outcome. After the commit, log
// each at ERROR (stream, range, opened_at, reason) and add one to
// onceflow_consumer_seq_gaps_given_up_total per gap.
func (o Outcome) GivenUp() []Step {
	var out []Step
	for _, st := range o.Steps {
		if st.Kind == StepGapGivenUp {
			out = append(out, st)
		}
	}
	return out
}

// PGStore keeps sequence guard state in Postgres (onceflow.seq_state,
// onceflow.seq_gaps, parked rows in onceflow.inbox) for one logical consumer.
// It is stateless; all methods work inside the caller's transaction or on
// the given Querier.
type PGStore struct {
	// Consumer names the logical consumer, as in onceflow.inbox.consumer.
	Consumer string
	// DeferInOrder makes Receive of an in-order event with nothing else to
	// do (the common case: no gap, no parked successor, not late) change
	// only the cached state, without a round trip; the caller must then call
	// Locked.Flush before it commits (and before it takes a savepoint it may
	// roll back to). Default false: every Receive writes at once.
	DeferInOrder bool
	// DeferWrites makes Receive and Tick queue the writes that need no
	// answer (parking, marking late, the gap records, the saved state)
	// and send them with the next statement that reads (an un-park, a
	// read of given-up gaps) or at Locked.Flush: an event parked behind
	// a gap and the one that fills it take one round trip, not two. As
	// with DeferInOrder the caller must call Flush before it commits (and
	// before it takes a savepoint it may roll back to); a queued write
	// that fails is reported by the call that sends it. Default false.
	DeferWrites bool
}

// Locked is the guard state of the streams a transaction has locked. It
// caches what it wrote, so it is valid only inside its transaction; if the
// caller rolls back to a savepoint taken after Lock, call Reload.
type Locked struct {
	store   *PGStore
	tx      pgx.Tx
	streams []Stream
	// parkedSQL reads the streams' parked rows (qLoadParked, or
	// loadParkedIn's statement for the consumer's lanes).
	parkedSQL string
	// lanes are the lanes parkedSQL reads (nil: every partition).
	lanes []string
	// stmts caches the statements built for lanes (inLane, unparkIn) by
	// their key: a batch builds each once.
	stmts  map[string]string
	states map[Stream]State
	// legacy is, for a stream of a producer that has not started, its
	// source's legacy state (started), which the stream adopts if its first
	// event lies above it.
	legacy map[Stream]State
	// dbNow is the database's clock, read with the lock.
	dbNow time.Time
	// dirty are streams whose cached last_applied is not written yet
	// (DeferInOrder).
	dirty map[Stream]bool
	// pending are the writes queued and not yet sent (DeferWrites).
	pending *pgx.Batch
	// stored is each stream's start, last_applied and first seq as the
	// database has them (loaded with the lock, then as written): what a
	// write moves on from.
	stored map[Stream]State
	// parkedAt spans the event_at of each stream's parked rows (read with
	// the lock, widened by each park): an un-park reads only the time
	// buckets in between.
	parkedAt map[Stream]parkedSpan
}

// parkedSpan is the least and the greatest event_at of a stream's parked
// rows; unbounded when one of them is not known (a row parked without its
// lane, or an infinite event_at).
type parkedSpan struct {
	lo, hi    time.Time
	unbounded bool
}

// widen makes spans[k] cover at (the zero time: a time not known).
func widen(spans map[Stream]parkedSpan, k Stream, at time.Time) {
	sp, ok := spans[k]
	switch {
	case at.IsZero():
		sp.unbounded = true
	case !ok:
		sp.lo, sp.hi = at, at
	default:
		if at.Before(sp.lo) {
			sp.lo = at
		}
		if at.After(sp.hi) {
			sp.hi = at
		}
	}
	spans[k] = sp
}

// Lock locks the seq_state rows of streams (creating missing ones) in
// stream order (source, producer, topic), so that transactions touching
// several streams cannot deadlock, and loads their state. Call it once per
// transaction with every stream the batch will Receive for, after the inbox
// insert. It reads the parked rows from every partition of onceflow.inbox;
// LockIn reads them from the consumer's own.
func (s *PGStore) Lock(ctx context.Context, tx pgx.Tx, streams []Stream, now time.Time) (*Locked, error) {
	return s.LockIn(ctx, tx, streams, now, nil)
}

// LockIn is Lock for a consumer whose inbox rows all lie in lanes (the
// inbox's dedup probe's lanes: every lane the consumer has a row in): the
// parked rows are read from the consumer's partitions of those lanes only,
// a statement that names the consumer and the lanes as constants, so that
// PostgreSQL neither plans nor locks the partitions of other consumer
// names (many services may share one database: a batch of one no longer
// waits for another's retention pass, and its cost no longer grows with
// their partitions). nil lanes: every partition, as Lock.
func (s *PGStore) LockIn(ctx context.Context, tx pgx.Tx, streams []Stream, now time.Time, lanes []string) (*Locked, error) {
	keys := slices.Clone(streams)
	slices.SortFunc(keys, compareStreams)
	keys = slices.Compact(keys)
	l := &Locked{store: s, tx: tx, streams: keys, parkedSQL: loadParkedIn(s.Consumer, lanes), lanes: lanes}
	// One round trip: create the missing rows, lock every row in stream
	// order, then read the parked seqs and open gaps under the lock (a
	// batch's statements run in order; each starts once the previous one
	// finished, so the reads see the locked state).
	c := s.Consumer
	states := make(map[Stream]State, len(keys))
	spans := map[Stream]parkedSpan{}
	srcs, prods, topics := streamArrays(keys)
	b := &pgx.Batch{}
	b.Queue(qEnsureState, c, srcs, prods, topics, now)
	b.Queue(qCustomPlans)
	b.Queue(qLockState, c, srcs, prods, topics)
	b.Queue(qWalkPlans)
	b.Queue(qReadState, c, srcs, prods, topics).Query(func(rows pgx.Rows) error {
		return l.scanLockedStates(rows, func(k Stream, st State) { states[k] = st })
	})
	b.Queue(qGapPlans)
	b.Queue(qLoadGaps, c, srcs, prods, topics).Query(func(rows pgx.Rows) error { return scanGaps(rows, states) })
	b.Queue(qRestorePlans)
	b.Queue(l.parkedSQL, c, srcs, prods, topics).Query(func(rows pgx.Rows) error { return scanParked(rows, states, spans) })
	beyond := l.queueLanesBeyond(b)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("lock seq state: %w", err)
	}
	if err := l.parkedBeyond(ctx, *beyond, keys, states, spans); err != nil {
		return nil, fmt.Errorf("lock seq state: %w", err)
	}
	if len(states) != len(keys) {
		return nil, fmt.Errorf("%w: consumer %q: locked %d of %d streams", ErrCorruptState, c, len(states), len(keys))
	}
	for k, st := range states {
		if err := st.Validate(); err != nil {
			return nil, fmt.Errorf("%w: consumer %q stream %s: %v", ErrCorruptState, c, k, err)
		}
	}
	l.states = states
	l.parkedAt = spans
	l.remember()
	return l, nil
}

// streamArrays lays streams out as the parallel arrays the statements take.
func streamArrays(keys []Stream) (srcs, prods, topics []string) {
	srcs, prods, topics = make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		srcs[i], prods[i], topics[i] = k.Source, k.Producer, k.Topic
	}
	return srcs, prods, topics
}

// queueLanesBeyond queues, after the read of the parked rows from l.lanes,
// the question whether the consumer has a lane that l.lanes lacks (one
// another replica recorded since the caller read its lanes). Its answer
// is in the returned bool once the batch is read; false without lanes.
func (l *Locked) queueLanesBeyond(b *pgx.Batch) *bool {
	beyond := new(bool)
	if l.lanes != nil {
		b.Queue(qLanesBeyond, l.store.Consumer, l.lanes).QueryRow(func(row pgx.Row) error { return row.Scan(beyond) })
	}
	return beyond
}

// parkedBeyond reads the parked rows of keys again from every partition
// when beyond: a row of the consumer may lie in a lane the first read left
// out. A lane is recorded (committed) before any row is written to it, and
// the question is asked after the read, so a parked row the read could see
// is in a lane the question sees. The rest of the transaction reads every
// partition too.
func (l *Locked) parkedBeyond(ctx context.Context, beyond bool, keys []Stream, states map[Stream]State, spans map[Stream]parkedSpan) error {
	if !beyond {
		return nil
	}
	l.parkedSQL, l.lanes, l.stmts = qLoadParked, nil, nil
	for _, k := range keys {
		if st, ok := states[k]; ok {
			st.Parked = nil
			states[k] = st
		}
		delete(spans, k)
	}
	srcs, prods, topics := streamArrays(keys)
	rows, err := l.tx.Query(ctx, qLoadParked, l.store.Consumer, srcs, prods, topics)
	if err != nil {
		return err
	}
	return scanParked(rows, states, spans)
}

// scanParked adds the parked rows read (stream, seq, event_at) to their
// streams' states and their times to spans.
func scanParked(rows pgx.Rows, states map[Stream]State, spans map[Stream]parkedSpan) error {
	var k Stream
	var seq int64
	var at pgtype.Timestamptz
	_, err := pgx.ForEachRow(rows, []any{&k.Source, &k.Producer, &k.Topic, &seq, &at}, func() error {
		st := states[k]
		st.Parked = append(st.Parked, seq)
		states[k] = st
		t := at.Time
		if !at.Valid || at.InfinityModifier != pgtype.Finite {
			t = time.Time{} // a row from before the inbox's partitioning (-infinity): unbounded
		}
		widen(spans, k, t)
		return nil
	})
	return err
}

func scanGaps(rows pgx.Rows, states map[Stream]State) error {
	var k Stream
	var g Gap
	_, err := pgx.ForEachRow(rows, []any{&k.Source, &k.Producer, &k.Topic, &g.From, &g.To, &g.OpenedAt, &g.Deadline, &g.GiveUpBy}, func() error {
		st := states[k]
		st.Gaps = append(st.Gaps, g)
		states[k] = st
		return nil
	})
	return err
}

// Now is the database's clock as the lock read it (the transaction's
// now()). Pass it to Receive, so that gap deadlines follow the database's
// clock, not the clock of the replica that happens to run the batch.
func (l *Locked) Now() time.Time { return l.dbNow }

// Reload re-reads the locked streams' state (after a rollback to a
// savepoint).
func (l *Locked) Reload(ctx context.Context) error {
	l.dirty, l.pending = nil, nil
	return l.load(ctx, qLockState, l.streams)
}

// Flush writes the state that Receive deferred (PGStore.DeferInOrder) and
// the writes it queued (PGStore.DeferWrites), in one round trip. Call it
// before committing; it is a no-op when nothing is pending.
func (l *Locked) Flush(ctx context.Context) error {
	if len(l.dirty) > 0 {
		if l.pending == nil {
			l.pending = &pgx.Batch{}
		}
		l.queueDirty(l.pending)
	}
	return l.sendPending(ctx)
}

// queueDirty queues the writes of the streams whose state Receive deferred
// (DeferInOrder), as one statement per kind of save, and counts them
// stored.
func (l *Locked) queueDirty(b *pgx.Batch) {
	keys := make([]Stream, 0, len(l.dirty))
	for k := range l.dirty {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareStreams)
	var floor, moved []Stream
	for _, k := range keys {
		switch l.saveOf(k, l.states[k]) {
		case saveFloor:
			floor = append(floor, k)
		case saveAppend:
			moved = append(moved, k)
		}
	}
	if len(floor) > 0 {
		lasts := make([]int64, len(floor))
		firsts := make([]int64, len(floor))
		for i, k := range floor {
			lasts[i] = l.states[k].LastApplied
			firsts[i] = l.states[k].First
		}
		srcs, prods, topics := streamArrays(floor)
		want := int64(len(floor))
		b.Queue(qSaveStates, l.store.Consumer, srcs, prods, topics, lasts, firsts, l.clock()).Exec(func(ct pgconn.CommandTag) error {
			if ct.RowsAffected() != want {
				return fmt.Errorf("save seq state: %d rows changed, want %d", ct.RowsAffected(), want)
			}
			return nil
		})
	}
	if len(moved) > 0 {
		lasts := make([]int64, len(moved))
		prevs := make([]int64, len(moved))
		for i, k := range moved {
			lasts[i] = l.states[k].LastApplied
			prevs[i] = l.stored[k].LastApplied
		}
		srcs, prods, topics := streamArrays(moved)
		b.Queue(qAppendApplieds, l.store.Consumer, srcs, prods, topics, lasts, prevs)
	}
	for _, k := range keys {
		st := l.states[k]
		l.stored[k] = State{Started: st.Started, LastApplied: st.LastApplied, First: st.First}
	}
	l.dirty = nil
}

// sendPending sends the queued writes (DeferWrites, and Flush's).
func (l *Locked) sendPending(ctx context.Context) error {
	if l.pending == nil {
		return nil
	}
	b := l.pending
	l.pending = nil
	if err := l.tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("seq guard: %w", err)
	}
	return nil
}

// State returns the loaded state of a locked stream.
func (l *Locked) State(k Stream) (State, bool) {
	st, ok := l.states[k]
	return st, ok
}

func (l *Locked) load(ctx context.Context, lockSQL string, keys []Stream) error {
	c := l.store.Consumer
	states := make(map[Stream]State, len(keys))
	spans := map[Stream]parkedSpan{}
	l.legacy = nil
	var locked []Stream
	scan := func(rows pgx.Rows) error {
		return l.scanLockedStates(rows, func(k Stream, st State) {
			states[k] = st
			locked = append(locked, k)
		})
	}
	var err error
	if lockSQL == qLockState {
		// With a custom plan, as in Lock (see qCustomPlans).
		srcs, prods, topics := streamArrays(keys)
		b := &pgx.Batch{}
		b.Queue(qCustomPlans)
		b.Queue(qLockState, c, srcs, prods, topics)
		b.Queue(qWalkPlans)
		b.Queue(qReadState, c, srcs, prods, topics).Query(scan)
		b.Queue(qRestorePlans)
		err = l.tx.SendBatch(ctx, b).Close()
	} else {
		// One stream, skipped when another transaction holds it; read
		// once locked.
		var got []string
		var rows pgx.Rows
		if rows, err = l.tx.Query(ctx, lockSQL, c, keys[0].Source, keys[0].Producer, keys[0].Topic); err == nil {
			got, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err == nil && len(got) == 1 {
			srcs, prods, topics := streamArrays(keys[:1])
			b := &pgx.Batch{}
			b.Queue(qCustomPlans)
			b.Queue(qWalkPlans)
			b.Queue(qReadState, c, srcs, prods, topics).Query(scan)
			b.Queue(qRestorePlans)
			err = l.tx.SendBatch(ctx, b).Close()
		}
	}
	if err != nil {
		return fmt.Errorf("lock seq state: %w", err)
	}
	if len(locked) > 0 {
		srcs, prods, topics := streamArrays(locked)
		b := &pgx.Batch{}
		b.Queue(l.parkedSQL, c, srcs, prods, topics).Query(func(rows pgx.Rows) error { return scanParked(rows, states, spans) })
		beyond := l.queueLanesBeyond(b)
		if err := l.tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("load parked: %w", err)
		}
		if err := l.parkedBeyond(ctx, *beyond, locked, states, spans); err != nil {
			return fmt.Errorf("load parked: %w", err)
		}
		b = &pgx.Batch{}
		b.Queue(qCustomPlans)
		b.Queue(qWalkPlans)
		b.Queue(qGapPlans)
		b.Queue(qLoadGaps, c, srcs, prods, topics).Query(func(rows pgx.Rows) error { return scanGaps(rows, states) })
		b.Queue(qRestorePlans)
		if err := l.tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("load gaps: %w", err)
		}
	}
	for k, st := range states {
		if err := st.Validate(); err != nil {
			return fmt.Errorf("%w: consumer %q stream %s: %v", ErrCorruptState, c, k, err)
		}
	}
	l.streams = locked
	l.states = states
	l.parkedAt = spans
	l.remember()
	return nil
}

// remember records the loaded states as what the database has.
func (l *Locked) remember() {
	l.stored = make(map[Stream]State, len(l.states))
	for k, st := range l.states {
		l.stored[k] = State{Started: st.Started, LastApplied: st.LastApplied, First: st.First}
	}
}

// saveKind is how a stream's new state reaches the database.
type saveKind int

const (
	saveNone   saveKind = iota
	saveFloor           // seq_state: the stream starts, or first_seq is set
	saveAppend          // seq_applied: last_applied moves on
)

// saveOf says how next reaches the database, given what it has.
func (l *Locked) saveOf(k Stream, next State) saveKind {
	had := l.stored[k]
	switch {
	case !next.Started:
		return saveNone
	case !had.Started || had.First != next.First:
		return saveFloor
	case had.LastApplied != next.LastApplied:
		return saveAppend
	}
	return saveNone
}

// Receive runs the guard for a new event (its inbox row already inserted by
// the caller in this transaction), writes the decisions and returns the
// handler runs owed, in order. p is the policy of the event's type class;
// zero fields take their defaults.
func (l *Locked) Receive(ctx context.Context, ev Event, now time.Time, p Policy) (Outcome, error) {
	k := ev.Stream()
	st, ok := l.states[k]
	if !ok {
		return Outcome{}, fmt.Errorf("%w: %s", ErrNotLocked, k)
	}
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return Outcome{}, err
	}
	prev := st
	if leg, ok := l.legacy[k]; ok {
		// The stream's first event: it adopts its source's legacy state
		// when it continues it (docs/seqguard.md, "Streams and the
		// upgrade"), as if the stream had applied what the legacy stream
		// did. One below or at the legacy last_applied is another
		// producer's: the stream starts by the start policy.
		delete(l.legacy, k)
		if !st.Started && len(st.Parked) == 0 && len(st.Gaps) == 0 && ev.Seq > leg.LastApplied {
			st = State{Started: true, LastApplied: leg.LastApplied, First: leg.First}
			prev = State{} // the adopted state must be written
		}
	}
	if st.Started && ev.Seq <= st.LastApplied {
		// Late or a duplicate: that depends on the given-up ranges, read
		// only now (they are not needed for anything else).
		if err := l.loadGivenUp(ctx, k, ev.Seq, &st); err != nil {
			return Outcome{}, err
		}
	}
	next, steps, err := st.Receive(ev.Seq, now, p)
	if err != nil {
		return Outcome{}, fmt.Errorf("event %s: %w", ev.EventID, err)
	}
	return l.execute(ctx, k, prev, next, steps, &ev, now)
}

// stmt returns the statement of kind for lane, building it once per
// Locked (unpark's depends on l.lanes only: its lane is "").
func (l *Locked) stmt(kind, lane string, build func() string) string {
	key := kind + "\x00" + lane
	if q, ok := l.stmts[key]; ok {
		return q
	}
	if l.stmts == nil {
		l.stmts = map[string]string{}
	}
	q := build()
	l.stmts[key] = q
	return q
}

// loadGivenUp adds to st the given-up ranges of stream k that hold seq.
func (l *Locked) loadGivenUp(ctx context.Context, k Stream, seq int64, st *State) error {
	if err := l.sendPending(ctx); err != nil {
		return err
	}
	rows, err := l.tx.Query(ctx, qGivenUpAt, l.store.Consumer, k.Source, seq, k.Producer, k.Topic)
	if err != nil {
		return fmt.Errorf("load given-up gaps: %w", err)
	}
	var g Gap
	_, err = pgx.ForEachRow(rows, []any{&g.From, &g.To, &g.OpenedAt, &g.Deadline}, func() error {
		for _, have := range st.GivenUp {
			if have.From == g.From && have.To == g.To {
				return nil
			}
		}
		st.GivenUp = append(st.GivenUp, g)
		slices.SortFunc(st.GivenUp, func(a, b Gap) int { return int(a.From - b.From) })
		return nil
	})
	if err != nil {
		return fmt.Errorf("load given-up gaps: %w", err)
	}
	return nil
}

// clock is the database's clock when the lock read it, else the replica's.
func (l *Locked) clock() time.Time {
	if l.dbNow.IsZero() {
		return time.Now()
	}
	return l.dbNow
}

// Tick gives up the stream's open gaps whose deadline is at or before now
// and returns the parked events to apply.
func (l *Locked) Tick(ctx context.Context, k Stream, now time.Time) (Outcome, error) {
	st, ok := l.states[k]
	if !ok {
		return Outcome{}, fmt.Errorf("%w: %s", ErrNotLocked, k)
	}
	next, steps := st.Tick(now)
	return l.execute(ctx, k, st, next, steps, nil, now)
}

// execute writes steps to Postgres. cur is the received event (nil for a
// tick).
func (l *Locked) execute(ctx context.Context, k Stream, prev, next State, steps []Step, cur *Event, now time.Time) (Outcome, error) {
	c := l.store.Consumer
	src, prod, topic := k.Source, k.Producer, k.Topic
	out := Outcome{Stream: k, Steps: steps}
	if len(steps) == 0 {
		return out, nil
	}
	if l.store.DeferInOrder && cur != nil && len(steps) == 1 && steps[0].Kind == StepApply && steps[0].Current && !steps[0].Late {
		// In order, nothing else to write: Flush saves last_applied.
		if next.Started != prev.Started || next.LastApplied != prev.LastApplied {
			if l.dirty == nil {
				l.dirty = map[Stream]bool{}
			}
			l.dirty[k] = true
		}
		l.states[k] = next
		out.Apply = []Apply{{Event: *cur, Current: true}}
		return out, nil
	}
	var unpark []int64
	b := l.pending
	if b == nil {
		b = &pgx.Batch{}
	}
	one := func(what string) func(pgconn.CommandTag) error {
		return func(ct pgconn.CommandTag) error {
			if ct.RowsAffected() != 1 {
				return fmt.Errorf("%s: %d rows changed, want 1", what, ct.RowsAffected())
			}
			return nil
		}
	}
	for _, stp := range steps {
		g := stp.Gap
		switch stp.Kind {
		case StepPark, StepHold, StepSeqConflict:
			st, late := status.Parked, false
			switch stp.Kind {
			case StepHold:
				st, late = status.Held, true
			case StepSeqConflict:
				st = status.Held
			}
			b.Queue(l.stmt("park", cur.Lane, func() string { return inLane(qPark, c, cur.Lane) }), c, cur.EventID, string(st), late, cur.Headers, cur.Payload).
				Exec(one(fmt.Sprintf("%s event %s: its inbox row must be inserted first", st, cur.EventID)))
			// A row inserted by this transaction (Event.Lane) has its time:
			// event_at, now(). Any other, a time not known.
			var at time.Time
			if cur.Lane != "" {
				at = l.dbNow
			}
			if l.parkedAt == nil {
				l.parkedAt = map[Stream]parkedSpan{}
			}
			widen(l.parkedAt, k, at)
		case StepApply:
			if !stp.Current {
				unpark = append(unpark, stp.Seq)
			} else if stp.Late {
				b.Queue(l.stmt("late", cur.Lane, func() string { return inLane(qMarkLate, c, cur.Lane) }), c, cur.EventID).Exec(one("mark event " + cur.EventID + " late"))
			}
		case StepGapOpened:
			b.Queue(qGapOpen, c, src, g.From, g.To, g.OpenedAt, g.Deadline, prod, topic, g.GiveUpBy)
		case StepGapNarrowed:
			b.Queue(qGapNarrow, c, src, g.From, g.To, stp.Parts[0].From, stp.Parts[0].To, prod, topic).Exec(one("narrow gap " + g.String()))
			for _, part := range stp.Parts[1:] {
				b.Queue(qGapOpen, c, src, part.From, part.To, part.OpenedAt, part.Deadline, prod, topic, part.GiveUpBy)
			}
		case StepGapFilled:
			b.Queue(qGapFill, c, src, g.From, g.To, now, prod, topic).Exec(one("fill gap " + g.String()))
		case StepGapGivenUp:
			b.Queue(qGapGiveUp, c, src, g.From, g.To, string(stp.Reason), now, prod, topic).Exec(one("give up gap " + g.String()))
		}
	}
	parked := map[int64]Event{}
	if len(unpark) > 0 {
		args := []any{c, src, unpark, now, prod, topic}
		kind := "unpark"
		if sp, ok := l.parkedAt[k]; ok && !sp.unbounded {
			kind, args = "unpark-at", append(args, sp.lo, sp.hi)
		}
		b.Queue(l.stmt(kind, "", func() string { return unparkIn(c, l.lanes, kind == "unpark-at") }), args...).Query(func(rows pgx.Rows) error {
			var e Event
			_, err := pgx.ForEachRow(rows, []any{&e.EventID, &e.Seq, &e.EventType, &e.Topic, &e.Partition, &e.Offset, &e.Headers, &e.Payload}, func() error {
				e.Source, e.Producer = src, prod
				parked[e.Seq] = e
				e = Event{}
				return nil
			})
			return err
		})
	}
	switch l.saveOf(k, next) {
	case saveFloor:
		var first any
		if next.First > 0 {
			first = next.First
		}
		b.Queue(qSaveState, c, src, next.LastApplied, now, first, prod, topic).Exec(one("save seq state"))
	case saveAppend:
		b.Queue(qAppendApplied, c, src, prod, topic, next.LastApplied, l.stored[k].LastApplied)
	}
	if l.store.DeferWrites && len(unpark) == 0 {
		// Nothing to read back: the writes go with the next statement
		// that reads, or with Flush.
		l.pending = b
	} else {
		l.pending = nil
		if err := l.tx.SendBatch(ctx, b).Close(); err != nil {
			return Outcome{}, fmt.Errorf("seq guard %s: %w", k, err)
		}
	}
	delete(l.dirty, k)
	l.stored[k] = State{Started: next.Started, LastApplied: next.LastApplied, First: next.First}
	for _, stp := range steps {
		if stp.Kind != StepApply {
			continue
		}
		if stp.Current {
			out.Apply = append(out.Apply, Apply{Event: *cur, Late: stp.Late, Current: true})
			continue
		}
		e, ok := parked[stp.Seq]
		if !ok {
			return Outcome{}, fmt.Errorf("%w: consumer %q stream %s: parked seq %d has no inbox row", ErrCorruptState, c, k, stp.Seq)
		}
		out.Apply = append(out.Apply, Apply{Event: e})
	}
	l.states[k] = next
	return out, nil
}

// GiveUpExpired is the gap timer. In tx it finds up to limit streams with an
// open gap whose deadline is at or before now, locks each one's seq_state
// row with SKIP LOCKED (a stream busy in another transaction, such as
// another replica's timer or a consumer batch, is left for the next run),
// re-reads its state under the lock and gives its expired gaps up. Because
// the decision is made under the row lock on freshly read state, each gap
// is given up once, whatever the number of replicas and restarts.
//
// The caller then runs its handler for every Apply of every outcome, in
// order, in tx, commits, and only after the commit logs each
// Outcome.GivenUp at ERROR and bumps the counter.
//
// The locks are taken in the same order as Lock's (seq_state before
// seq_gaps), so the timer and consumer batches cannot deadlock.
//
// A zero now means the database's clock (now() of tx): then no replica's
// clock, however skewed, decides when a gap is given up.
//
// It reads and un-parks the streams' parked rows in every partition of
// onceflow.inbox; GiveUpExpiredIn reads the consumer's own.
func (s *PGStore) GiveUpExpired(ctx context.Context, tx pgx.Tx, now time.Time, limit int) ([]Outcome, error) {
	return s.GiveUpExpiredIn(ctx, tx, now, limit, nil)
}

// GiveUpExpiredIn is GiveUpExpired reading the streams' parked rows from
// the inbox partitions of lanes only, as LockIn does (every partition when
// the consumer has a lane the list lacks, or with nil lanes).
func (s *PGStore) GiveUpExpiredIn(ctx context.Context, tx pgx.Tx, now time.Time, limit int, lanes []string) ([]Outcome, error) {
	if limit <= 0 {
		limit = 100
	}
	if now.IsZero() {
		if err := tx.QueryRow(ctx, qDBNow).Scan(&now); err != nil {
			return nil, fmt.Errorf("read the database clock: %w", err)
		}
	}
	rows, err := tx.Query(ctx, qExpiredStreams, s.Consumer, now, limit)
	if err != nil {
		return nil, fmt.Errorf("find expired gaps: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Stream, error) {
		var k Stream
		err := r.Scan(&k.Source, &k.Producer, &k.Topic)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("find expired gaps: %w", err)
	}
	var outs []Outcome
	for _, k := range keys {
		l := &Locked{store: s, tx: tx, parkedSQL: loadParkedIn(s.Consumer, lanes), lanes: lanes}
		if err := l.load(ctx, qLockStateSkipLocked, []Stream{k}); err != nil {
			return nil, err
		}
		if _, ok := l.states[k]; !ok {
			continue // locked elsewhere
		}
		out, err := l.Tick(ctx, k, now)
		if err != nil {
			return nil, err
		}
		if err := l.Flush(ctx); err != nil {
			return nil, err
		}
		if len(out.Steps) > 0 {
			outs = append(outs, out)
		}
	}
	return outs, nil
}

// Stats are the guard's gauges for one consumer.
type Stats struct {
	OpenGaps int64
	// OldestOpenGapAge is zero when no gap is open.
	OldestOpenGapAge time.Duration
	Parked           int64
	Held             int64
}

// Stats reads the gauges (onceflow_consumer_seq_open_gaps,
// _seq_oldest_open_gap_age_seconds, _parked_events, _held_events). A zero
// now measures the oldest gap's age on the database's clock.
func (s *PGStore) Stats(ctx context.Context, q dbtx.DB, now time.Time) (Stats, error) {
	var st Stats
	var oldest *time.Time
	var dbNow time.Time
	if err := q.QueryRow(ctx, qStats, s.Consumer).Scan(&st.OpenGaps, &oldest, &dbNow, &st.Parked, &st.Held); err != nil {
		return Stats{}, fmt.Errorf("seq guard stats: %w", err)
	}
	if now.IsZero() {
		now = dbNow
	}
	if oldest != nil {
		st.OldestOpenGapAge = max(now.Sub(*oldest), 0)
	}
	return st, nil
}

// GapRecord is a row of onceflow.seq_gaps.
type GapRecord struct {
	ID     int64
	Source string
	// Producer and Topic complete the gap's stream (both "" for a legacy
	// stream).
	Producer string
	Topic    string
	From, To int64
	OpenedAt time.Time
	Deadline time.Time
	// State is open, filled or given_up.
	State string
	// Reason is set for given_up: timeout, max_parked or operator.
	Reason       GiveUpReason
	ClosedAt     *time.Time
	ResolvedAt   *time.Time
	ResolvedNote string
	// GiveUpBy names who asked to give the gap up now (RequestGiveUp).
	GiveUpBy string
}

// ListGaps lists the open gaps and, when includeGivenUp is set, the
// given-up gaps that are unresolved or were given up at or after since.
// Open gaps come first; then by source and range.
func (s *PGStore) ListGaps(ctx context.Context, q dbtx.DB, includeGivenUp bool, since time.Time) ([]GapRecord, error) {
	rows, err := q.Query(ctx, qListGaps, s.Consumer, includeGivenUp, since)
	if err != nil {
		return nil, fmt.Errorf("list gaps: %w", err)
	}
	var out []GapRecord
	var r GapRecord
	var reason string
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.Source, &r.Producer, &r.Topic, &r.From, &r.To, &r.OpenedAt, &r.Deadline, &r.State,
		&reason, &r.ClosedAt, &r.ResolvedAt, &r.ResolvedNote, &r.GiveUpBy}, func() error {
		r.Reason = GiveUpReason(reason)
		out = append(out, r)
		r = GapRecord{}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list gaps: %w", err)
	}
	return out, nil
}

// Stream is the gap's stream.
func (r GapRecord) Stream() Stream {
	return Stream{Producer: r.Producer, Topic: r.Topic, Source: r.Source}
}

// ResolveGap records an operator's note on the unresolved given-up gaps of
// stream k lying within from..to and returns how many it resolved
// (ErrGapNotFound when none). It changes no guard state: a given-up gap's
// events are handled by the late policy whenever they arrive.
func (s *PGStore) ResolveGap(ctx context.Context, q dbtx.DB, k Stream, from, to int64, note string, now time.Time) (int64, error) {
	if note == "" {
		return 0, errors.New("seqguard: resolve gap: a note is required")
	}
	if from < 1 || to < from {
		return 0, fmt.Errorf("seqguard: resolve gap: bad range %d-%d", from, to)
	}
	ct, err := q.Exec(ctx, qResolveGaps, s.Consumer, k.Source, from, to, note, now, k.Producer, k.Topic)
	if err != nil {
		return 0, fmt.Errorf("resolve gap: %w", err)
	}
	if ct.RowsAffected() == 0 {
		return 0, ErrGapNotFound
	}
	return ct.RowsAffected(), nil
}

// RequestGiveUp asks for the open gaps of stream k up to the one holding to
// to be given up now, on behalf of by, and returns them (ErrGapNotFound when
// no open gap meets from..to). It takes the stream's seq_state lock, so it
// waits for a consumer deciding on the stream and the consumer then sees the
// request. The gaps are not given up here: the consumer's gap timer does it
// at its next tick (it runs the handler for the parked events released
// behind them), with ReasonOperator. Gaps are given up in seq order, so the
// open gaps below from go too. q must be a transaction for the lock to
// cover the update. now is the request's time; zero means the database's
// clock (what the consumer's timer uses).
func (s *PGStore) RequestGiveUp(ctx context.Context, q Querier, k Stream, from, to int64, by string, now time.Time) ([]Gap, error) {
	if by == "" {
		return nil, errors.New("seqguard: give up gap: who asks is required")
	}
	if from < 1 || to < from {
		return nil, fmt.Errorf("seqguard: give up gap: bad range %d-%d", from, to)
	}
	if _, err := q.Exec(ctx, qLockStreamState, s.Consumer, k.Source, k.Producer, k.Topic); err != nil {
		return nil, fmt.Errorf("give up gap: lock stream: %w", err)
	}
	var at *time.Time
	if !now.IsZero() {
		at = &now
	}
	rows, err := q.Query(ctx, qRequestGiveUp, s.Consumer, k.Source, from, to, by, k.Producer, k.Topic, at)
	if err != nil {
		return nil, fmt.Errorf("give up gap: %w", err)
	}
	var out []Gap
	var g Gap
	if _, err := pgx.ForEachRow(rows, []any{&g.From, &g.To}, func() error {
		g.GiveUpBy = by
		out = append(out, g)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("give up gap: %w", err)
	}
	if len(out) == 0 {
		return nil, ErrGapNotFound
	}
	slices.SortFunc(out, func(a, b Gap) int { return cmp.Compare(a.From, b.From) })
	return out, nil
}

// scanLockedStates reads the rows of qReadState:
// each stream's state, the database's clock into l.dbNow, and the legacy
// state a stream that has not started may adopt into l.legacy.
func (l *Locked) scanLockedStates(rows pgx.Rows, each func(k Stream, st State)) error {
	var k Stream
	var last, first, legLast, legFirst *int64
	_, err := pgx.ForEachRow(rows, []any{&k.Source, &k.Producer, &k.Topic, &last, &first, &l.dbNow, &legLast, &legFirst}, func() error {
		each(k, stateOf(last, first))
		if last == nil && legLast != nil {
			if l.legacy == nil {
				l.legacy = map[Stream]State{}
			}
			l.legacy[k] = stateOf(legLast, legFirst)
		}
		return nil
	})
	return err
}

// stateOf is a state from its stored last_applied and first_seq.
func stateOf(last, first *int64) State {
	st := State{}
	if last != nil {
		st.Started, st.LastApplied = true, *last
	}
	if first != nil && last != nil {
		st.First = *first
	}
	return st
}
