package inbox

import (
	"context"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// This file is the seam for the sequence guard (pkg/seqguard). The engine
// locks the guard state of a batch's sources once per transaction, after the
// inbox rows were inserted (status 'processed') and before any handler runs,
// then admits each new event in offset order. The guard answers with the
// ordered list of events to apply now: possibly none (the event was parked
// or held), possibly earlier parked events before or after it. The guard
// writes its own state (seq state, gaps, parked and held inbox rows) in the
// same transaction; the engine only runs the handler for what it returns.

// Ordering chooses how a consumer orders each source's events.
type Ordering int

const (
	// OrderSeq applies each source's events in seq order through the
	// sequence guard (pkg/seqguard): an event ahead of a gap is parked in
	// Postgres until the gap fills or times out. The default.
	OrderSeq Ordering = iota
	// OrderArrival applies events in the order they arrive, seq ignored.
	OrderArrival
)

// String returns the ordering's configuration name.
func (o Ordering) String() string {
	switch o {
	case OrderSeq:
		return "seq"
	case OrderArrival:
		return "arrival"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// ParseOrdering parses "seq" or "arrival".
func ParseOrdering(s string) (Ordering, error) {
	for _, o := range []Ordering{OrderSeq, OrderArrival} {
		if o.String() == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("unknown ordering %q (want seq or arrival)", s)
}

// GapTimeout is the gap timeout of an event-type class: the first rule whose
// Pattern (a path.Match glob, e.g. "billing.*") matches an event's type
// gives the timeout of the gaps that event opens.
type GapTimeout struct {
	Pattern string
	Timeout time.Duration
}

// ParseGapTimeouts parses a comma-separated list of glob=duration rules,
// e.g. "billing.*=5m,agent.*=10s". An empty string is no rules.
func ParseGapTimeouts(s string) ([]GapTimeout, error) {
	var out []GapTimeout
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		pat, dur, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("rule %q: want glob=duration", part)
		}
		d, err := time.ParseDuration(strings.TrimSpace(dur))
		if err != nil {
			return nil, fmt.Errorf("rule %q: %v", part, err)
		}
		r := GapTimeout{Pattern: strings.TrimSpace(pat), Timeout: d}
		if err := r.validate(); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func (r GapTimeout) validate() error {
	if r.Pattern == "" {
		return fmt.Errorf("rule %q: empty pattern", r.Pattern+"="+r.Timeout.String())
	}
	if _, err := path.Match(r.Pattern, ""); err != nil {
		return fmt.Errorf("rule %q: bad pattern: %v", r.Pattern, err)
	}
	if r.Timeout <= 0 {
		return fmt.Errorf("rule %q: timeout must be positive, got %v", r.Pattern, r.Timeout)
	}
	return nil
}

// guard decides, per source, which events may be applied now.
type guard interface {
	// lock is called once per transaction, after the inbox insert, with
	// the batch's new valid events (in offset order). An error aborts the
	// whole batch (infrastructure trouble: retried, never dead-lettered).
	// lanes are the consumer's lanes (the dedup probe's): every lane its
	// inbox rows lie in.
	lock(ctx context.Context, tx pgx.Tx, evs []*item, lanes []string) (admitter, error)
}

// admitter admits the new events of one transaction, in offset order.
type admitter interface {
	admit(ctx context.Context, it *item) (admitted, error)
	// flush writes what admit deferred; called once, after the last admit
	// and before the handler runs.
	flush(ctx context.Context) error
}

// admitted is the guard's answer for one event.
type admitted struct {
	// apply are the events to run the handler for now, in order (Late set
	// where the guard says so).
	apply []Event
	// steps are the guard's decisions, for the counters and the ERROR log
	// of given-up gaps after the commit.
	steps guardSteps
	// released are the released parked events among apply, as the store
	// returned them (with the headers and payload their rows had kept).
	released []seqguard.Event
	// raw are the guard's steps for the event (for its span).
	raw []seqguard.Step
}

// guardSteps tallies guard decisions of committed transactions.
type guardSteps struct {
	counts  seqguard.Counts
	givenUp []givenUpGap
}

type givenUpGap struct {
	stream seqguard.Stream
	step   seqguard.Step
	// traceIDs of the events that waited behind the gap, and txSpan the span
	// of the transaction that gave it up (see tracing.go).
	traceIDs []string
	txSpan   trace.SpanContext
}

func (g *guardSteps) addOutcome(o seqguard.Outcome) {
	c := seqguard.Count(o.Steps)
	g.counts.Applied += c.Applied
	g.counts.Late += c.Late
	g.counts.Held += c.Held
	g.counts.Duplicates += c.Duplicates
	g.counts.Parked += c.Parked
	g.counts.GapsOpened += c.GapsOpened
	g.counts.GapsGivenUp += c.GapsGivenUp
	for _, st := range o.GivenUp() {
		g.givenUp = append(g.givenUp, givenUpGap{stream: o.Stream, step: st, traceIDs: outcomeTraceIDs(o)})
	}
}

func (g *guardSteps) add(o guardSteps) {
	g.counts.Applied += o.counts.Applied
	g.counts.Late += o.counts.Late
	g.counts.Held += o.counts.Held
	g.counts.Duplicates += o.counts.Duplicates
	g.counts.Parked += o.counts.Parked
	g.counts.GapsOpened += o.counts.GapsOpened
	g.counts.GapsGivenUp += o.counts.GapsGivenUp
	g.givenUp = append(g.givenUp, o.givenUp...)
}

// arrivalOrder applies every event in the order it arrives.
type arrivalOrder struct{}

func (arrivalOrder) lock(context.Context, pgx.Tx, []*item, []string) (admitter, error) {
	return arrivalOrder{}, nil
}

func (arrivalOrder) admit(_ context.Context, it *item) (admitted, error) {
	return admitted{apply: []Event{it.ev}}, nil
}

func (arrivalOrder) flush(context.Context) error { return nil }

// seqGuard is the sequence guard backed by seqguard.PGStore.
type seqGuard struct {
	store *seqguard.PGStore
	cfg   *Config
}

func newSeqGuard(cfg *Config) *seqGuard {
	// In-order events (the common case) cost no round trip each: their
	// last_applied is written once per transaction by flush.
	return &seqGuard{store: &seqguard.PGStore{Consumer: cfg.ConsumerName, DeferInOrder: true, DeferWrites: true}, cfg: cfg}
}

// policy is the guard policy of an event type's class.
func (g *seqGuard) policy(eventType string) seqguard.Policy {
	p := seqguard.Policy{FirstSeen: g.cfg.FirstSeen, GapTimeout: g.cfg.GapTimeout, Late: g.cfg.LatePolicy, MaxParked: g.cfg.MaxParked}
	for _, r := range g.cfg.GapTimeouts {
		if ok, _ := path.Match(r.Pattern, eventType); ok {
			p.GapTimeout = r.Timeout
			break
		}
	}
	return p
}

func (g *seqGuard) lock(ctx context.Context, tx pgx.Tx, evs []*item, lanes []string) (admitter, error) {
	streams := make([]seqguard.Stream, len(evs))
	for i, it := range evs {
		streams[i] = it.ev.stream()
	}
	// The parked rows are read from the consumer's own partitions.
	l, err := g.store.LockIn(ctx, tx, streams, g.cfg.Clock(), lanes)
	if err != nil {
		return nil, err
	}
	// Gap deadlines on the database's clock: a replica whose clock is off
	// opens gaps that expire neither early nor late.
	return &seqLocked{g: g, l: l, now: l.Now()}, nil
}

type seqLocked struct {
	g   *seqGuard
	l   *seqguard.Locked
	now time.Time
}

func (s *seqLocked) admit(ctx context.Context, it *item) (admitted, error) {
	ev := it.ev
	gev := seqguard.Event{
		EventID: ev.EventID, Source: ev.Source, Producer: ev.Producer, Seq: ev.Seq, EventType: ev.EventType,
		Topic: ev.Topic, Partition: ev.Partition, Offset: ev.Offset, Lane: it.lane,
	}
	// Headers and payload are written only if the event is parked or held.
	// The next seq of a source with nothing parked and no open gap is
	// applied at once, so the common case skips encoding its headers
	// (a JSON object per event was a sixth of the consumer's CPU).
	if st, ok := s.l.State(ev.stream()); !ok || !st.Started || ev.Seq != st.LastApplied+1 || len(st.Parked) > 0 || len(st.Gaps) > 0 {
		gev.Headers, gev.Payload = recordHeaders(it.rec), nonNil(it.rec.Value)
	}
	out, err := s.l.Receive(ctx, gev, s.now, s.g.policy(ev.EventType))
	if err != nil {
		return admitted{}, err
	}
	apply, err := s.g.events(out, &ev)
	if err != nil {
		return admitted{}, err
	}
	var steps guardSteps
	steps.addOutcome(out)
	var released []seqguard.Event
	for _, a := range out.Apply {
		if !a.Current {
			released = append(released, a.Event)
		}
	}
	return admitted{apply: apply, steps: steps, released: released, raw: out.Steps}, nil
}

func (s *seqLocked) flush(ctx context.Context) error { return s.l.Flush(ctx) }

// events turns an outcome's Apply list into handler events, in order. cur
// is the event passed to Receive (nil for the gap timer).
func (g *seqGuard) events(out seqguard.Outcome, cur *Event) ([]Event, error) {
	evs := make([]Event, 0, len(out.Apply))
	for _, a := range out.Apply {
		var ev Event
		if a.Current {
			if cur == nil {
				return nil, fmt.Errorf("sequence guard: stream %s: a current event without one", out.Stream)
			}
			ev = *cur
		} else {
			var err error
			if ev, err = releasedEvent(a.Event); err != nil {
				return nil, err
			}
		}
		ev.Late = a.Late
		evs = append(evs, ev)
	}
	return evs, nil
}

// releasedEvent rebuilds a parked event from what its inbox row kept.
func releasedEvent(e seqguard.Event) (Event, error) {
	rec, err := recordFromRow(e.Topic, e.Partition, e.Offset, e.Headers, e.Payload)
	if err != nil {
		return Event{}, fmt.Errorf("released event %s: %w", e.EventID, err)
	}
	env, err := envelope.Decode(rec, len(e.Payload)+1)
	if err != nil {
		return Event{}, fmt.Errorf("released event %s: %w", e.EventID, err)
	}
	ev := eventFromEnvelope(env, e.Topic, e.Partition, e.Offset)
	if len(ev.Key) == 0 {
		ev.Key = []byte(ev.Source) // the key is not kept; the relay keys by source
	}
	return ev, nil
}

// nonNil makes an empty payload an empty (not NULL) bytea when it is kept.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
