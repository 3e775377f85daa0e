package seqguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/inbox/status"
)

// Querier runs statements: pgx.Tx, *pgx.Conn and *pgxpool.Pool all are one.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Event is an event as the guard needs it. For the event passed to Receive
// EventID, Source and Seq are required; Headers and Payload are written to
// its inbox row if it is parked or held (nil leaves what the row holds, for
// a caller that writes them itself). Events returned from parking carry
// everything the inbox kept: with Topic, Partition, Offset, Headers and
// Payload the caller can rebuild and decode the original record.
type Event struct {
	EventID   string
	Source    string
	Seq       int64
	EventType string
	Topic     string
	Partition int32
	Offset    int64
	// Headers as stored in the inbox's jsonb column.
	Headers json.RawMessage
	Payload []byte
}

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

// Outcome is what the store did for one source and what the caller must do.
type Outcome struct {
	Source string
	// Steps are the state machine's decisions, already written to Postgres.
	// Tally them for the counters with Count.
	Steps []Step
	// Apply lists the handler runs the caller owes, in order, inside the
	// same transaction.
	Apply []Apply
}

// GivenUp returns the gaps given up in this outcome. After the commit, log
// each at ERROR (source, range, opened_at, reason) and add one to
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
}

// Locked is the guard state of the sources a transaction has locked. It
// caches what it wrote, so it is valid only inside its transaction; if the
// caller rolls back to a savepoint taken after Lock, call Reload.
type Locked struct {
	store   *PGStore
	tx      pgx.Tx
	sources []string
	states  map[string]State
	// dbNow is the database's clock, read with the lock.
	dbNow time.Time
	// dirty are sources whose cached last_applied is not written yet
	// (DeferInOrder).
	dirty map[string]bool
}

// Lock locks the seq_state rows of sources (creating missing ones) in
// source order, so that transactions touching several sources cannot
// deadlock, and loads their state. Call it once per transaction with every
// source the batch will Receive for, after the inbox insert.
func (s *PGStore) Lock(ctx context.Context, tx pgx.Tx, sources []string, now time.Time) (*Locked, error) {
	srcs := slices.Clone(sources)
	slices.Sort(srcs)
	srcs = slices.Compact(srcs)
	l := &Locked{store: s, tx: tx, sources: srcs}
	// One round trip: create the missing rows, lock every row in source
	// order, then read the parked seqs and open gaps under the lock (a
	// batch's statements run in order; each starts once the previous one
	// finished, so the reads see the locked state).
	c := s.Consumer
	states := make(map[string]State, len(srcs))
	b := &pgx.Batch{}
	b.Queue(qEnsureState, c, srcs, now)
	b.Queue(qCustomPlans)
	b.Queue(qLockState, c, srcs).Query(func(rows pgx.Rows) error {
		return scanLockedStates(rows, &l.dbNow, func(src string, st State) { states[src] = st })
	})
	b.Queue(qRestorePlans)
	b.Queue(qLoadParked, c, srcs).Query(func(rows pgx.Rows) error {
		var src string
		var seq int64
		_, err := pgx.ForEachRow(rows, []any{&src, &seq}, func() error {
			st := states[src]
			st.Parked = append(st.Parked, seq)
			states[src] = st
			return nil
		})
		return err
	})
	b.Queue(qLoadGaps, c, srcs).Query(func(rows pgx.Rows) error {
		var src string
		var g Gap
		_, err := pgx.ForEachRow(rows, []any{&src, &g.From, &g.To, &g.OpenedAt, &g.Deadline}, func() error {
			st := states[src]
			st.Gaps = append(st.Gaps, g)
			states[src] = st
			return nil
		})
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("lock seq state: %w", err)
	}
	if len(states) != len(srcs) {
		return nil, fmt.Errorf("%w: consumer %q: locked %d of %d sources", ErrCorruptState, c, len(states), len(srcs))
	}
	for src, st := range states {
		if err := st.Validate(); err != nil {
			return nil, fmt.Errorf("%w: consumer %q source %q: %v", ErrCorruptState, c, src, err)
		}
	}
	l.states = states
	return l, nil
}

// Now is the database's clock as the lock read it (the transaction's
// now()). Pass it to Receive, so that gap deadlines follow the database's
// clock, not the clock of the replica that happens to run the batch.
func (l *Locked) Now() time.Time { return l.dbNow }

// Reload re-reads the locked sources' state (after a rollback to a
// savepoint).
func (l *Locked) Reload(ctx context.Context) error {
	l.dirty = nil
	return l.load(ctx, qLockState, l.sources)
}

// Flush writes the state that Receive deferred (PGStore.DeferInOrder) in one
// statement. Call it before committing; it is a no-op when nothing is
// pending.
func (l *Locked) Flush(ctx context.Context) error {
	if len(l.dirty) == 0 {
		return nil
	}
	srcs := make([]string, 0, len(l.dirty))
	for src := range l.dirty {
		srcs = append(srcs, src)
	}
	slices.Sort(srcs)
	lasts := make([]int64, len(srcs))
	firsts := make([]int64, len(srcs))
	for i, src := range srcs {
		lasts[i] = l.states[src].LastApplied
		firsts[i] = l.states[src].First
	}
	ct, err := l.tx.Exec(ctx, qSaveStates, l.store.Consumer, srcs, lasts, l.clock(), firsts)
	if err != nil {
		return fmt.Errorf("save seq state: %w", err)
	}
	if ct.RowsAffected() != int64(len(srcs)) {
		return fmt.Errorf("save seq state: %d rows changed, want %d", ct.RowsAffected(), len(srcs))
	}
	l.dirty = nil
	return nil
}

// State returns the loaded state of a locked source.
func (l *Locked) State(source string) (State, bool) {
	st, ok := l.states[source]
	return st, ok
}

func (l *Locked) load(ctx context.Context, lockSQL string, srcs []string) error {
	c := l.store.Consumer
	states := make(map[string]State, len(srcs))
	var locked []string
	scan := func(rows pgx.Rows) error {
		return scanLockedStates(rows, &l.dbNow, func(src string, st State) {
			states[src] = st
			locked = append(locked, src)
		})
	}
	var err error
	if lockSQL == qLockState {
		// With a custom plan, as in Lock (see qCustomPlans).
		b := &pgx.Batch{}
		b.Queue(qCustomPlans)
		b.Queue(qLockState, c, srcs).Query(scan)
		b.Queue(qRestorePlans)
		err = l.tx.SendBatch(ctx, b).Close()
	} else {
		var rows pgx.Rows
		if rows, err = l.tx.Query(ctx, lockSQL, c, srcs[0]); err == nil {
			err = scan(rows)
		}
	}
	if err != nil {
		return fmt.Errorf("lock seq state: %w", err)
	}
	if len(locked) > 0 {
		rows, err := l.tx.Query(ctx, qLoadParked, c, locked)
		if err != nil {
			return fmt.Errorf("load parked: %w", err)
		}
		var src string
		var seq int64
		if _, err := pgx.ForEachRow(rows, []any{&src, &seq}, func() error {
			st := states[src]
			st.Parked = append(st.Parked, seq)
			states[src] = st
			return nil
		}); err != nil {
			return fmt.Errorf("load parked: %w", err)
		}
		rows, err = l.tx.Query(ctx, qLoadGaps, c, locked)
		if err != nil {
			return fmt.Errorf("load gaps: %w", err)
		}
		var g Gap
		if _, err := pgx.ForEachRow(rows, []any{&src, &g.From, &g.To, &g.OpenedAt, &g.Deadline}, func() error {
			st := states[src]
			st.Gaps = append(st.Gaps, g)
			states[src] = st
			return nil
		}); err != nil {
			return fmt.Errorf("load gaps: %w", err)
		}
	}
	for src, st := range states {
		if err := st.Validate(); err != nil {
			return fmt.Errorf("%w: consumer %q source %q: %v", ErrCorruptState, c, src, err)
		}
	}
	l.sources = locked
	l.states = states
	return nil
}

// Receive runs the guard for a new event (its inbox row already inserted by
// the caller in this transaction), writes the decisions and returns the
// handler runs owed, in order. p is the policy of the event's type class;
// zero fields take their defaults.
func (l *Locked) Receive(ctx context.Context, ev Event, now time.Time, p Policy) (Outcome, error) {
	st, ok := l.states[ev.Source]
	if !ok {
		return Outcome{}, fmt.Errorf("%w: %q", ErrNotLocked, ev.Source)
	}
	p = p.WithDefaults()
	if err := p.Validate(); err != nil {
		return Outcome{}, err
	}
	if st.Started && ev.Seq <= st.LastApplied {
		// Late or a duplicate: that depends on the given-up ranges, read
		// only now (they are not needed for anything else).
		if err := l.loadGivenUp(ctx, ev.Source, ev.Seq, &st); err != nil {
			return Outcome{}, err
		}
	}
	next, steps, err := st.Receive(ev.Seq, now, p)
	if err != nil {
		return Outcome{}, fmt.Errorf("event %s: %w", ev.EventID, err)
	}
	return l.execute(ctx, ev.Source, st, next, steps, &ev, now)
}

// loadGivenUp adds to st the given-up ranges of source that hold seq.
func (l *Locked) loadGivenUp(ctx context.Context, source string, seq int64, st *State) error {
	rows, err := l.tx.Query(ctx, qGivenUpAt, l.store.Consumer, source, seq)
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

// Tick gives up the source's open gaps whose deadline is at or before now
// and returns the parked events to apply.
func (l *Locked) Tick(ctx context.Context, source string, now time.Time) (Outcome, error) {
	st, ok := l.states[source]
	if !ok {
		return Outcome{}, fmt.Errorf("%w: %q", ErrNotLocked, source)
	}
	next, steps := st.Tick(now)
	return l.execute(ctx, source, st, next, steps, nil, now)
}

// execute writes steps to Postgres. cur is the received event (nil for a
// tick).
func (l *Locked) execute(ctx context.Context, src string, prev, next State, steps []Step, cur *Event, now time.Time) (Outcome, error) {
	c := l.store.Consumer
	out := Outcome{Source: src, Steps: steps}
	if len(steps) == 0 {
		return out, nil
	}
	if l.store.DeferInOrder && cur != nil && len(steps) == 1 && steps[0].Kind == StepApply && steps[0].Current && !steps[0].Late {
		// In order, nothing else to write: Flush saves last_applied.
		if next.Started != prev.Started || next.LastApplied != prev.LastApplied {
			if l.dirty == nil {
				l.dirty = map[string]bool{}
			}
			l.dirty[src] = true
		}
		l.states[src] = next
		out.Apply = []Apply{{Event: *cur, Current: true}}
		return out, nil
	}
	var unpark []int64
	b := &pgx.Batch{}
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
			b.Queue(qPark, c, cur.EventID, string(st), late, cur.Headers, cur.Payload).
				Exec(one(fmt.Sprintf("%s event %s: its inbox row must be inserted first", st, cur.EventID)))
		case StepApply:
			if !stp.Current {
				unpark = append(unpark, stp.Seq)
			} else if stp.Late {
				b.Queue(qMarkLate, c, cur.EventID).Exec(one("mark event " + cur.EventID + " late"))
			}
		case StepGapOpened:
			b.Queue(qGapOpen, c, src, g.From, g.To, g.OpenedAt, g.Deadline)
		case StepGapNarrowed:
			b.Queue(qGapNarrow, c, src, g.From, g.To, stp.Parts[0].From, stp.Parts[0].To).Exec(one("narrow gap " + g.String()))
			for _, part := range stp.Parts[1:] {
				b.Queue(qGapOpen, c, src, part.From, part.To, part.OpenedAt, part.Deadline)
			}
		case StepGapFilled:
			b.Queue(qGapFill, c, src, g.From, g.To, now).Exec(one("fill gap " + g.String()))
		case StepGapGivenUp:
			b.Queue(qGapGiveUp, c, src, g.From, g.To, string(stp.Reason), now).Exec(one("give up gap " + g.String()))
		}
	}
	parked := map[int64]Event{}
	if len(unpark) > 0 {
		b.Queue(qUnpark, c, src, unpark, now).Query(func(rows pgx.Rows) error {
			var e Event
			_, err := pgx.ForEachRow(rows, []any{&e.EventID, &e.Seq, &e.EventType, &e.Topic, &e.Partition, &e.Offset, &e.Headers, &e.Payload}, func() error {
				e.Source = src
				parked[e.Seq] = e
				e = Event{}
				return nil
			})
			return err
		})
	}
	if next.Started != prev.Started || next.LastApplied != prev.LastApplied || l.dirty[src] {
		var first any
		if next.First > 0 {
			first = next.First
		}
		b.Queue(qSaveState, c, src, next.LastApplied, now, first).Exec(one("save seq state"))
	}
	if err := l.tx.SendBatch(ctx, b).Close(); err != nil {
		return Outcome{}, fmt.Errorf("seq guard %q: %w", src, err)
	}
	delete(l.dirty, src)
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
			return Outcome{}, fmt.Errorf("%w: consumer %q source %q: parked seq %d has no inbox row", ErrCorruptState, c, src, stp.Seq)
		}
		out.Apply = append(out.Apply, Apply{Event: e})
	}
	l.states[src] = next
	return out, nil
}

// GiveUpExpired is the gap timer. In tx it finds up to limit sources with an
// open gap whose deadline is at or before now, locks each one's seq_state
// row with SKIP LOCKED (a source busy in another transaction, such as
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
func (s *PGStore) GiveUpExpired(ctx context.Context, tx pgx.Tx, now time.Time, limit int) ([]Outcome, error) {
	if limit <= 0 {
		limit = 100
	}
	if now.IsZero() {
		if err := tx.QueryRow(ctx, qDBNow).Scan(&now); err != nil {
			return nil, fmt.Errorf("read the database clock: %w", err)
		}
	}
	rows, err := tx.Query(ctx, qExpiredSources, s.Consumer, now, limit)
	if err != nil {
		return nil, fmt.Errorf("find expired gaps: %w", err)
	}
	srcs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find expired gaps: %w", err)
	}
	var outs []Outcome
	for _, src := range srcs {
		l := &Locked{store: s, tx: tx}
		if err := l.load(ctx, qLockStateSkipLocked, []string{src}); err != nil {
			return nil, err
		}
		if _, ok := l.states[src]; !ok {
			continue // locked elsewhere
		}
		out, err := l.Tick(ctx, src, now)
		if err != nil {
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
func (s *PGStore) Stats(ctx context.Context, q Querier, now time.Time) (Stats, error) {
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
	ID       int64
	Source   string
	From, To int64
	OpenedAt time.Time
	Deadline time.Time
	// State is open, filled or given_up.
	State string
	// Reason is set for given_up: timeout or max_parked.
	Reason       GiveUpReason
	ClosedAt     *time.Time
	ResolvedAt   *time.Time
	ResolvedNote string
}

// ListGaps lists the open gaps and, when includeGivenUp is set, the
// given-up gaps that are unresolved or were given up at or after since.
// Open gaps come first; then by source and range.
func (s *PGStore) ListGaps(ctx context.Context, q Querier, includeGivenUp bool, since time.Time) ([]GapRecord, error) {
	rows, err := q.Query(ctx, qListGaps, s.Consumer, includeGivenUp, since)
	if err != nil {
		return nil, fmt.Errorf("list gaps: %w", err)
	}
	var out []GapRecord
	var r GapRecord
	var reason string
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &r.Source, &r.From, &r.To, &r.OpenedAt, &r.Deadline, &r.State,
		&reason, &r.ClosedAt, &r.ResolvedAt, &r.ResolvedNote}, func() error {
		r.Reason = GiveUpReason(reason)
		out = append(out, r)
		r = GapRecord{}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("list gaps: %w", err)
	}
	return out, nil
}

// ResolveGap records an operator's note on the unresolved given-up gaps of
// source lying within from..to and returns how many it resolved
// (ErrGapNotFound when none). It changes no guard state: a given-up gap's
// events are handled by the late policy whenever they arrive.
func (s *PGStore) ResolveGap(ctx context.Context, q Querier, source string, from, to int64, note string, now time.Time) (int64, error) {
	if note == "" {
		return 0, errors.New("seqguard: resolve gap: a note is required")
	}
	if from < 1 || to < from {
		return 0, fmt.Errorf("seqguard: resolve gap: bad range %d-%d", from, to)
	}
	ct, err := q.Exec(ctx, qResolveGaps, s.Consumer, source, from, to, note, now)
	if err != nil {
		return 0, fmt.Errorf("resolve gap: %w", err)
	}
	if ct.RowsAffected() == 0 {
		return 0, ErrGapNotFound
	}
	return ct.RowsAffected(), nil
}

// scanLockedStates reads the rows of qLockState (or a one-source lock):
// each source's state, and the database's clock into dbNow.
func scanLockedStates(rows pgx.Rows, dbNow *time.Time, each func(src string, st State)) error {
	var src string
	var last, first *int64
	_, err := pgx.ForEachRow(rows, []any{&src, &last, &first, dbNow}, func() error {
		st := State{}
		if last != nil {
			st.Started, st.LastApplied = true, *last
		}
		if first != nil && last != nil {
			st.First = *first
		}
		each(src, st)
		return nil
	})
	return err
}
