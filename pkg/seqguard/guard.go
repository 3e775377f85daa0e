package seqguard

// This file is the pure decision logic: no I/O, no database or Kafka client,
// time is an input. Keep its imports to the standard library (a test checks).

import (
	"fmt"
	"slices"
	"time"
)

// FirstSeen is the start policy for a source seen for the first time.
type FirstSeen int

const (
	// ExpectFirstSeq1 treats a new source as if it had applied seq 0: a first
	// event with seq 5 is parked and opens the gap 1–4. The default.
	ExpectFirstSeq1 FirstSeen = iota
	// AcceptFirstSeen starts a new source at whatever seq arrives first
	// (last_applied := seq-1). Use it when a consumer joins a stream whose
	// beginning it will never see.
	AcceptFirstSeen
)

// String returns the policy's configuration name.
func (f FirstSeen) String() string {
	switch f {
	case ExpectFirstSeq1:
		return "expect-first-seq-1"
	case AcceptFirstSeen:
		return "accept-first-seen"
	}
	return fmt.Sprintf("FirstSeen(%d)", int(f))
}

// ParseFirstSeen parses "expect-first-seq-1" or "accept-first-seen".
func ParseFirstSeen(s string) (FirstSeen, error) {
	for _, f := range []FirstSeen{ExpectFirstSeq1, AcceptFirstSeen} {
		if f.String() == s {
			return f, nil
		}
	}
	return 0, fmt.Errorf("unknown first-seen policy %q (want expect-first-seq-1 or accept-first-seen)", s)
}

// Late is the policy for a late event: one whose seq lies in a range that
// was given up (or below the seq the source started at), so it was never
// applied. An event at or below last_applied outside such a range was
// applied in order: its redelivery (after retention pruned its inbox row) is
// a duplicate under either policy.
type Late int

const (
	// DeliverLate hands the event to the handler marked late. The default.
	DeliverLate Late = iota
	// Hold keeps the event (inbox status 'held') for an operator.
	Hold
)

// String returns the policy's configuration name.
func (l Late) String() string {
	switch l {
	case DeliverLate:
		return "deliver-late"
	case Hold:
		return "hold"
	}
	return fmt.Sprintf("Late(%d)", int(l))
}

// ParseLate parses "deliver-late" or "hold".
func ParseLate(s string) (Late, error) {
	for _, l := range []Late{DeliverLate, Hold} {
		if l.String() == s {
			return l, nil
		}
	}
	return 0, fmt.Errorf("unknown late policy %q (want deliver-late or hold)", s)
}

// Defaults of Policy.
const (
	DefaultGapTimeout = 30 * time.Second
	DefaultMaxParked  = 1000
)

// Policy configures the guard. The consumer may use a different Policy per
// event-type class; the one passed with an event applies to that event (the
// GapTimeout to a gap the event opens).
type Policy struct {
	// FirstSeen is the start policy for a new source. Default ExpectFirstSeq1.
	FirstSeen FirstSeen
	// GapTimeout is how long a gap stays open before it is given up.
	// Default DefaultGapTimeout (30 s).
	GapTimeout time.Duration
	// Late is the policy for late events. Default DeliverLate.
	Late Late
	// MaxParked bounds the parked events of one source. When parking an
	// event would exceed it, the lowest open gaps are given up early (reason
	// ReasonMaxParked) until the parked events that follow them have been
	// applied and the bound holds again. Default DefaultMaxParked (1000).
	MaxParked int
}

// WithDefaults returns p with zero fields set to their defaults.
func (p Policy) WithDefaults() Policy {
	if p.GapTimeout == 0 {
		p.GapTimeout = DefaultGapTimeout
	}
	if p.MaxParked == 0 {
		p.MaxParked = DefaultMaxParked
	}
	return p
}

// Validate reports the first bad field of p.
func (p Policy) Validate() error {
	switch {
	case p.FirstSeen != ExpectFirstSeq1 && p.FirstSeen != AcceptFirstSeen:
		return fmt.Errorf("seqguard: Policy.FirstSeen: unknown value %d", int(p.FirstSeen))
	case p.Late != DeliverLate && p.Late != Hold:
		return fmt.Errorf("seqguard: Policy.Late: unknown value %d", int(p.Late))
	case p.GapTimeout <= 0:
		return fmt.Errorf("seqguard: Policy.GapTimeout: must be positive, got %v", p.GapTimeout)
	case p.MaxParked < 1:
		return fmt.Errorf("seqguard: Policy.MaxParked: must be at least 1, got %d", p.MaxParked)
	}
	return nil
}

// Gap is a missing, inclusive seq range of a source.
type Gap struct {
	From, To int64
	OpenedAt time.Time
	// Deadline is when the gap is given up if still open.
	Deadline time.Time
	// GiveUpBy names who asked to give the gap up now (an operator through
	// the CLI or the console); empty when nobody did. The request moved
	// Deadline to its own time, and the gap is given up with
	// ReasonOperator. A gap split by an arriving event keeps it in both
	// parts.
	GiveUpBy string
}

func (g Gap) String() string { return fmt.Sprintf("%d-%d", g.From, g.To) }

func (g Gap) contains(seq int64) bool { return g.From <= seq && seq <= g.To }

// GiveUpReason says why a gap was given up.
type GiveUpReason string

const (
	// ReasonTimeout: the gap was open past its deadline.
	ReasonTimeout GiveUpReason = "timeout"
	// ReasonMaxParked: the source hit Policy.MaxParked and the gap was given
	// up early so that the parked events behind it could apply.
	ReasonMaxParked GiveUpReason = "max_parked"
	// ReasonOperator: an operator asked to give the gap up now
	// (Gap.GiveUpBy), for example after skipping the missing row at the
	// producer.
	ReasonOperator GiveUpReason = "operator"
)

// State is one source's guard state. The zero value is a source never seen.
// A State is a value: Receive and Tick return a new one and leave the
// receiver untouched.
type State struct {
	// Started is false until the source's first event was decided.
	Started bool
	// First is the seq the source started at (1 under ExpectFirstSeq1, the
	// first seq seen under AcceptFirstSeen); seqs below it were never
	// applied. 0 means unknown (a source started before it was recorded):
	// then it is taken as 1 under ExpectFirstSeq1, and under
	// AcceptFirstSeen every seq at or below LastApplied outside a given-up
	// range is treated as late rather than risk dropping it.
	First int64
	// LastApplied is the highest seq applied in order (or skipped by a
	// given-up gap).
	LastApplied int64
	// GivenUp are given-up ranges, ascending: their seqs were never applied
	// in order, so one arriving later is late. The store loads only those
	// that matter to the event at hand; Receive appends the ranges it gives
	// up.
	GivenUp []Gap
	// Parked holds the parked seqs, ascending; all are above LastApplied+1.
	Parked []int64
	// Gaps are the open gaps, ascending and disjoint: exactly the maximal
	// runs of missing seqs between LastApplied and the highest parked seq.
	// Their deadlines never decrease.
	Gaps []Gap
}

func (s State) clone() State {
	s.Parked = slices.Clone(s.Parked)
	s.Gaps = slices.Clone(s.Gaps)
	s.GivenUp = slices.Clone(s.GivenUp)
	return s
}

// neverApplied reports whether seq, at or below LastApplied, was never
// applied in order: it lies in a given-up range or below where the source
// started (or where that is unknown under AcceptFirstSeen).
func (s State) neverApplied(seq int64, p Policy) bool {
	first := s.First
	if first == 0 {
		if p.FirstSeen == AcceptFirstSeen {
			return true
		}
		first = 1
	}
	if seq < first {
		return true
	}
	for _, g := range s.GivenUp {
		if g.contains(seq) {
			return true
		}
	}
	return false
}

// Validate checks the invariants of s (see State's field docs).
func (s State) Validate() error {
	if s.LastApplied < 0 {
		return fmt.Errorf("last_applied %d is negative", s.LastApplied)
	}
	if !s.Started && (s.LastApplied != 0 || s.First != 0 || len(s.Parked) > 0 || len(s.Gaps) > 0 || len(s.GivenUp) > 0) {
		return fmt.Errorf("source not started but has state")
	}
	if s.First < 0 || (s.First > 0 && s.First > s.LastApplied+1) {
		return fmt.Errorf("first seq %d is not in 1..%d", s.First, s.LastApplied+1)
	}
	for _, g := range s.GivenUp {
		if g.From < 1 || g.To < g.From || g.To > s.LastApplied {
			return fmt.Errorf("given-up range %v is not at or below last_applied %d", g, s.LastApplied)
		}
	}
	prev := s.LastApplied + 1
	for _, p := range s.Parked {
		if p <= prev {
			return fmt.Errorf("parked seq %d not above %d", p, prev)
		}
		prev = p
	}
	// The gaps must be exactly the missing runs below the highest parked seq.
	var want [][2]int64
	next := s.LastApplied + 1
	for _, p := range s.Parked {
		if p > next {
			want = append(want, [2]int64{next, p - 1})
		}
		next = p + 1
	}
	if len(want) != len(s.Gaps) {
		return fmt.Errorf("%d open gaps, want %d for parked %v above %d", len(s.Gaps), len(want), s.Parked, s.LastApplied)
	}
	for i, g := range s.Gaps {
		if g.From != want[i][0] || g.To != want[i][1] {
			return fmt.Errorf("gap %v, want %d-%d", g, want[i][0], want[i][1])
		}
		if i > 0 && g.Deadline.Before(s.Gaps[i-1].Deadline) {
			return fmt.Errorf("gap %v has a deadline before the gap below it", g)
		}
	}
	return nil
}

// NextDeadline is the earliest deadline of an open gap, if any: the time at
// which Tick would next do something.
func (s State) NextDeadline() (time.Time, bool) {
	if len(s.Gaps) == 0 {
		return time.Time{}, false
	}
	return s.Gaps[0].Deadline, true // deadlines never decrease
}

// StepKind says what a Step does.
type StepKind int

const (
	// StepApply: run the handler for Seq (Late: it is a late event; Current:
	// it is the event passed to Receive, else a parked one).
	StepApply StepKind = iota + 1
	// StepPark: keep the received event (Seq) parked until its turn.
	StepPark
	// StepHold: keep the received late event (Seq) for an operator.
	StepHold
	// StepDuplicate: the received event's seq (Seq) is at or below
	// last_applied and was applied in order: it is a redelivery of an
	// applied event whose inbox row is gone (retention pruned it). Nothing
	// is applied.
	StepDuplicate
	// StepSeqConflict: another event with the received seq (Seq) is already
	// parked: two event ids claim one seq, a producer bug. The received
	// event is held for an operator whatever the late policy.
	StepSeqConflict
	// StepGapOpened: Gap is now missing.
	StepGapOpened
	// StepGapNarrowed: Gap was partly filled; Parts (one or two gaps, with
	// Gap's OpenedAt and Deadline) replace it.
	StepGapNarrowed
	// StepGapFilled: Gap was wholly filled before its deadline.
	StepGapFilled
	// StepGapGivenUp: Gap is given up for Reason; LastApplied moves past it.
	StepGapGivenUp
)

func (k StepKind) String() string {
	switch k {
	case StepApply:
		return "apply"
	case StepPark:
		return "park"
	case StepHold:
		return "hold"
	case StepDuplicate:
		return "duplicate"
	case StepSeqConflict:
		return "seq-conflict"
	case StepGapOpened:
		return "gap-opened"
	case StepGapNarrowed:
		return "gap-narrowed"
	case StepGapFilled:
		return "gap-filled"
	case StepGapGivenUp:
		return "gap-given-up"
	}
	return fmt.Sprintf("StepKind(%d)", int(k))
}

// Step is one decision. Steps are returned in the order they must be
// carried out; the handler runs for each StepApply in that order.
type Step struct {
	Kind StepKind
	// Seq of StepApply, StepPark, StepHold, StepSeqConflict.
	Seq int64
	// Late marks a StepApply of a late event.
	Late bool
	// Current marks a StepApply of the event passed to Receive (as opposed
	// to a parked event).
	Current bool
	// Gap of the gap steps: the range as it was before the step.
	Gap Gap
	// Parts of StepGapNarrowed.
	Parts []Gap
	// Reason of StepGapGivenUp.
	Reason GiveUpReason
}

func (st Step) String() string {
	switch st.Kind {
	case StepApply:
		s := fmt.Sprintf("apply %d", st.Seq)
		if st.Late {
			s += " late"
		}
		if !st.Current {
			s += " parked"
		}
		return s
	case StepPark, StepHold, StepSeqConflict, StepDuplicate:
		return fmt.Sprintf("%v %d", st.Kind, st.Seq)
	case StepGapNarrowed:
		return fmt.Sprintf("%v %v -> %v", st.Kind, st.Gap, st.Parts)
	case StepGapGivenUp:
		return fmt.Sprintf("%v %v (%s)", st.Kind, st.Gap, st.Reason)
	}
	return fmt.Sprintf("%v %v", st.Kind, st.Gap)
}

// Receive decides what to do with an event of the source with seq, received
// at now, that the inbox has not seen before. p should have had WithDefaults
// applied; Receive does not validate it.
func (s State) Receive(seq int64, now time.Time, p Policy) (State, []Step, error) {
	if seq < 1 {
		return s, nil, ErrInvalidSeq
	}
	s = s.clone()
	if !s.Started {
		s.Started = true
		s.First = 1
		if p.FirstSeen == AcceptFirstSeen {
			s.LastApplied = seq - 1
			s.First = seq
		}
	}
	var steps []Step
	switch {
	case seq <= s.LastApplied && !s.neverApplied(seq, p):
		return s, []Step{{Kind: StepDuplicate, Seq: seq}}, nil

	case seq <= s.LastApplied:
		if p.Late == Hold {
			return s, []Step{{Kind: StepHold, Seq: seq}}, nil
		}
		return s, []Step{{Kind: StepApply, Seq: seq, Late: true, Current: true}}, nil

	case seq == s.LastApplied+1:
		steps = append(steps, Step{Kind: StepApply, Seq: seq, Current: true})
		s.LastApplied = seq
		if len(s.Gaps) > 0 { // then the lowest gap starts at seq
			steps = s.shrinkLowestGap(steps)
		}
		steps = s.drain(steps)

	default: // seq > LastApplied+1
		if _, found := slices.BinarySearch(s.Parked, seq); found {
			return s, []Step{{Kind: StepSeqConflict, Seq: seq}}, nil
		}
		top := s.LastApplied
		if n := len(s.Parked); n > 0 {
			top = s.Parked[n-1]
		}
		steps = append(steps, Step{Kind: StepPark, Seq: seq})
		switch {
		case seq > top+1:
			g := Gap{From: top + 1, To: seq - 1, OpenedAt: now, Deadline: now.Add(p.GapTimeout)}
			if n := len(s.Gaps); n > 0 && g.Deadline.Before(s.Gaps[n-1].Deadline) {
				g.Deadline = s.Gaps[n-1].Deadline
			}
			s.Gaps = append(s.Gaps, g)
			steps = append(steps, Step{Kind: StepGapOpened, Gap: g})
		case seq < top:
			steps = s.fillInside(seq, steps)
		}
		i, _ := slices.BinarySearch(s.Parked, seq)
		s.Parked = slices.Insert(s.Parked, i, seq)
		for len(s.Parked) > p.MaxParked && len(s.Gaps) > 0 {
			steps = s.giveUpLowest(ReasonMaxParked, steps)
		}
		// If the bound made the received event itself apply, it was never
		// really parked: drop the park step and mark the apply as current.
		for i := range steps {
			if steps[i].Kind == StepApply && steps[i].Seq == seq {
				steps[i].Current = true
				steps = slices.DeleteFunc(steps, func(st Step) bool { return st.Kind == StepPark && st.Seq == seq })
				break
			}
		}
	}
	return s, steps, nil
}

// Tick gives up, in seq order, the open gaps whose deadline is at or before
// now, applying the parked events behind each.
func (s State) Tick(now time.Time) (State, []Step) {
	if len(s.Gaps) == 0 || now.Before(s.Gaps[0].Deadline) {
		return s, nil
	}
	s = s.clone()
	var steps []Step
	for len(s.Gaps) > 0 && !now.Before(s.Gaps[0].Deadline) {
		reason := ReasonTimeout
		if s.Gaps[0].GiveUpBy != "" {
			reason = ReasonOperator
		}
		steps = s.giveUpLowest(reason, steps)
	}
	return s, steps
}

// shrinkLowestGap records that the lowest gap's first seq (LastApplied) has
// been applied.
func (s *State) shrinkLowestGap(steps []Step) []Step {
	g := s.Gaps[0]
	if g.From == g.To {
		s.Gaps = s.Gaps[1:]
		return append(steps, Step{Kind: StepGapFilled, Gap: g})
	}
	n := g
	n.From++
	s.Gaps[0] = n
	return append(steps, Step{Kind: StepGapNarrowed, Gap: g, Parts: []Gap{n}})
}

// fillInside records that seq, inside an open gap, has arrived (and is
// being parked).
func (s *State) fillInside(seq int64, steps []Step) []Step {
	i := slices.IndexFunc(s.Gaps, func(g Gap) bool { return g.contains(seq) })
	g := s.Gaps[i]
	var parts []Gap
	if seq > g.From {
		lo := g
		lo.To = seq - 1
		parts = append(parts, lo)
	}
	if seq < g.To {
		hi := g
		hi.From = seq + 1
		parts = append(parts, hi)
	}
	s.Gaps = slices.Replace(s.Gaps, i, i+1, parts...)
	if len(parts) == 0 {
		return append(steps, Step{Kind: StepGapFilled, Gap: g})
	}
	return append(steps, Step{Kind: StepGapNarrowed, Gap: g, Parts: parts})
}

func (s *State) giveUpLowest(reason GiveUpReason, steps []Step) []Step {
	g := s.Gaps[0]
	s.Gaps = s.Gaps[1:]
	s.LastApplied = g.To
	s.GivenUp = append(s.GivenUp, g)
	steps = append(steps, Step{Kind: StepGapGivenUp, Gap: g, Reason: reason})
	return s.drain(steps)
}

// drain applies the parked events that are now contiguous.
func (s *State) drain(steps []Step) []Step {
	for len(s.Parked) > 0 && s.Parked[0] == s.LastApplied+1 {
		s.LastApplied = s.Parked[0]
		steps = append(steps, Step{Kind: StepApply, Seq: s.Parked[0]})
		s.Parked = s.Parked[1:]
	}
	return steps
}

// Counts tallies steps for the consumer's counters.
type Counts struct {
	Applied     int // in order, including parked events applied
	Late        int // applied marked late
	Held        int // late events held and seq conflicts
	Duplicates  int // redeliveries of events applied in order (StepDuplicate)
	Parked      int
	GapsOpened  int
	GapsGivenUp int
}

// Count tallies steps.
func Count(steps []Step) Counts {
	var c Counts
	for _, st := range steps {
		switch st.Kind {
		case StepApply:
			if st.Late {
				c.Late++
			} else {
				c.Applied++
			}
		case StepHold, StepSeqConflict:
			c.Held++
		case StepDuplicate:
			c.Duplicates++
		case StepPark:
			c.Parked++
		case StepGapOpened:
			c.GapsOpened++
		case StepGapGivenUp:
			c.GapsGivenUp++
		}
	}
	return c
}
