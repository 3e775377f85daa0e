package seqguard

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// model is the reference for one source: sets and a loop, no gap records.
// Each missing seq carries the deadline it got when it went missing.
type model struct {
	started  bool
	last     int64
	parked   map[int64]bool
	deadline map[int64]time.Time // missing seqs below the highest parked one
	applied  []int64             // in-order applies
	late     []int64
	held     []int64
	dups     []int64 // redeliveries of seqs applied in order
	lost     []int64 // seqs skipped by a give-up
}

func (m *model) appliedInOrder(seq int64) bool { return slices.Contains(m.applied, seq) }

func newModel() *model {
	return &model{parked: map[int64]bool{}, deadline: map[int64]time.Time{}}
}

func (m *model) top() int64 {
	t := m.last
	for s := range m.parked {
		t = max(t, s)
	}
	return t
}

func (m *model) drain() {
	for m.parked[m.last+1] {
		delete(m.parked, m.last+1)
		m.last++
		m.applied = append(m.applied, m.last)
	}
}

// giveUpLowest loses the lowest missing run.
func (m *model) giveUpLowest() {
	for !m.parked[m.last+1] {
		m.last++
		m.lost = append(m.lost, m.last)
		delete(m.deadline, m.last)
	}
	m.drain()
}

func (m *model) receive(seq int64, now time.Time, p Policy) {
	if !m.started {
		m.started = true
		if p.FirstSeen == AcceptFirstSeen {
			m.last = seq - 1
		}
	}
	switch {
	case seq <= m.last && m.appliedInOrder(seq):
		m.dups = append(m.dups, seq)
	case seq <= m.last:
		if p.Late == Hold {
			m.held = append(m.held, seq)
		} else {
			m.late = append(m.late, seq)
		}
	case seq == m.last+1:
		m.last = seq
		delete(m.deadline, seq)
		m.applied = append(m.applied, seq)
		m.drain()
	default:
		top := m.top()
		if seq > top+1 {
			d := now.Add(p.GapTimeout)
			for _, old := range m.deadline {
				if old.After(d) {
					d = old
				}
			}
			for s := top + 1; s < seq; s++ {
				m.deadline[s] = d
			}
		}
		delete(m.deadline, seq)
		m.parked[seq] = true
		for len(m.parked) > p.MaxParked {
			m.giveUpLowest()
		}
	}
}

func (m *model) tick(now time.Time) {
	for {
		d, ok := m.deadline[m.last+1]
		if !ok || now.Before(d) {
			return
		}
		m.giveUpLowest()
	}
}

// tally is what the implementation did, collected from its steps.
type tally struct {
	applied, late, held, dups, lost []int64
	givenUp                         []Gap
}

func (t *tally) add(steps []Step) {
	for _, st := range steps {
		switch st.Kind {
		case StepApply:
			if st.Late {
				t.late = append(t.late, st.Seq)
			} else {
				t.applied = append(t.applied, st.Seq)
			}
		case StepHold:
			t.held = append(t.held, st.Seq)
		case StepDuplicate:
			t.dups = append(t.dups, st.Seq)
		case StepGapGivenUp:
			t.givenUp = append(t.givenUp, st.Gap)
			for s := st.Gap.From; s <= st.Gap.To; s++ {
				t.lost = append(t.lost, s)
			}
		}
	}
}

// FuzzGuard drives the state machine and the reference model with the same
// random interleaving of new, out-of-order, missing and late events and
// clock ticks over a few sources, and checks that they agree and that per
// source: in-order applies strictly increase, nothing is applied twice,
// nothing is lost without a given-up gap, each gap is given up once.
func FuzzGuard(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 2, 0})
	f.Add([]byte{0x10, 0, 2, 1, 1, 0x83, 3, 4, 0x90, 7})
	f.Add([]byte{0x03, 3, 0, 9, 0, 8, 0, 7, 0xff, 40, 0, 1, 0, 2})
	f.Add([]byte{0x2c, 5, 0, 6, 1, 7, 2, 0xa0, 30, 4, 1, 3, 0})
	f.Add([]byte{0xf1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20})
	f.Add([]byte{0x01, 0, 4, 0, 0, 0, 1, 0x08, 0, 0x08, 1, 0x90, 60, 0, 2, 0x08, 2, 0, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		cfg := data[0]
		data = data[1:]
		base := Policy{
			FirstSeen:  FirstSeen(cfg & 1),
			Late:       Late(cfg >> 1 & 1),
			MaxParked:  1 + int(cfg>>2&7),
			GapTimeout: 30 * time.Second,
		}
		const sources = 3
		const maxSeq = 24
		var (
			states [sources]State
			models [sources]*model
			tal    [sources]tally
			seen   [sources]map[int64]bool
			now    = t0
		)
		for i := range sources {
			models[i] = newModel()
			seen[i] = map[int64]bool{}
		}
		for len(data) >= 2 {
			a, b := data[0], data[1]
			data = data[2:]
			if a&0x80 != 0 { // clock tick
				now = now.Add(time.Duration(b) * time.Second)
				for i := range sources {
					var steps []Step
					states[i], steps = states[i].Tick(now)
					tal[i].add(steps)
					models[i].tick(now)
					agree(t, i, states[i], models[i])
				}
				continue
			}
			src := int(a>>5) % sources
			p := base
			if a&0x10 != 0 { // another event-type class with a shorter timeout
				p.GapTimeout = 5 * time.Second
			}
			if a&0x08 != 0 && len(models[src].applied) > 0 {
				// A redelivery of an event applied in order whose inbox row
				// retention pruned: the inbox lets it through, the guard
				// must call it a duplicate and change nothing. (Late and
				// held events keep their inbox rows: never pruned.)
				seq := models[src].applied[int(b)%len(models[src].applied)]
				before := states[src]
				next, steps, err := states[src].Receive(seq, now, p)
				if err != nil {
					t.Fatal(err)
				}
				if len(steps) != 1 || steps[0].Kind != StepDuplicate || next.LastApplied != before.LastApplied ||
					!slices.Equal(next.Parked, before.Parked) || len(next.Gaps) != len(before.Gaps) {
					t.Fatalf("source %d: redelivered applied seq %d: steps %v, state %+v -> %+v", src, seq, steps, before, next)
				}
				states[src] = next
				tal[src].add(steps)
				models[src].receive(seq, now, p)
				continue
			}
			// Pick an event not seen before: the next one after b's choice.
			seq := int64(b)%maxSeq + 1
			for seen[src][seq] {
				seq = seq%maxSeq + 1
				if seq == int64(b)%maxSeq+1 {
					break
				}
			}
			if seen[src][seq] {
				continue // every seq of this source delivered
			}
			seen[src][seq] = true
			var steps []Step
			var err error
			states[src], steps, err = states[src].Receive(seq, now, p)
			if err != nil {
				t.Fatal(err)
			}
			tal[src].add(steps)
			models[src].receive(seq, now, p)
			agree(t, src, states[src], models[src])
			if len(states[src].Parked) > p.MaxParked {
				t.Fatalf("source %d: %d parked, bound %d", src, len(states[src].Parked), p.MaxParked)
			}
		}
		// In the end every gap times out.
		now = now.Add(24 * time.Hour)
		for i := range sources {
			var steps []Step
			states[i], steps = states[i].Tick(now)
			tal[i].add(steps)
			models[i].tick(now)
		}
		for i := range sources {
			check(t, i, states[i], models[i], &tal[i], seen[i], base)
		}
	})
}

// agree checks the state after every input: invariants, the model's
// last_applied and parked set, and that NextDeadline is the earliest one.
func agree(t *testing.T, src int, s State, m *model) {
	t.Helper()
	if err := s.Validate(); err != nil {
		t.Fatalf("source %d: invalid state %+v: %v", src, s, err)
	}
	var parked []int64
	for q := range m.parked {
		parked = append(parked, q)
	}
	slices.Sort(parked)
	if s.LastApplied != m.last || !slices.Equal(s.Parked, parked) {
		t.Fatalf("source %d: state last %d parked %v, model last %d parked %v", src, s.LastApplied, s.Parked, m.last, parked)
	}
	d, ok := s.NextDeadline()
	if ok != (len(s.Gaps) > 0) {
		t.Fatalf("source %d: NextDeadline ok=%v with %d gaps", src, ok, len(s.Gaps))
	}
	for _, g := range s.Gaps {
		if g.Deadline.Before(d) {
			t.Fatalf("source %d: NextDeadline %v after gap %v deadline %v", src, d, g, g.Deadline)
		}
		for q := g.From; q <= g.To; q++ {
			if !m.deadline[q].Equal(g.Deadline) {
				t.Fatalf("source %d: gap %v deadline %v, model has %v for %d", src, g, g.Deadline, m.deadline[q], q)
			}
		}
	}
}

func check(t *testing.T, src int, s State, m *model, tal *tally, seen map[int64]bool, p Policy) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("source %d: %s\nstate %+v\nmodel applied %v late %v held %v lost %v\nimpl  applied %v late %v held %v lost %v",
			src, fmt.Sprintf(format, args...), s, m.applied, m.late, m.held, m.lost, tal.applied, tal.late, tal.held, tal.lost)
	}
	if err := s.Validate(); err != nil {
		fail("invalid state: %v", err)
	}
	if len(s.Parked) != 0 || len(s.Gaps) != 0 {
		fail("parked or gaps left after every deadline passed")
	}
	if !slices.Equal(tal.applied, m.applied) || !slices.Equal(tal.late, m.late) || !slices.Equal(tal.dups, m.dups) ||
		!slices.Equal(tal.held, m.held) || !slices.Equal(tal.lost, m.lost) || s.LastApplied != m.last {
		fail("implementation and model disagree")
	}
	// In-order applies strictly increase.
	for i := 1; i < len(tal.applied); i++ {
		if tal.applied[i] <= tal.applied[i-1] {
			fail("applied %d after %d", tal.applied[i], tal.applied[i-1])
		}
	}
	// Nothing applied twice (in order or late), nothing handled twice.
	handled := map[int64]string{}
	for kind, list := range map[string][]int64{"applied": tal.applied, "late": tal.late, "held": tal.held} {
		for _, q := range list {
			if prev, dup := handled[q]; dup {
				fail("seq %d %s and %s", q, prev, kind)
			}
			handled[q] = kind
			if !seen[q] {
				fail("seq %d %s but never received", q, kind)
			}
		}
	}
	// Each gap given up once: given-up ranges are disjoint.
	lost := map[int64]bool{}
	for _, g := range tal.givenUp {
		for q := g.From; q <= g.To; q++ {
			if lost[q] {
				fail("seq %d in two given-up gaps", q)
			}
			lost[q] = true
		}
	}
	// Nothing lost silently: every received seq was handled, and every seq up
	// to last_applied was applied in order or is in a given-up gap (or lies
	// below where an accept-first-seen source started).
	for q := range seen {
		if _, ok := handled[q]; !ok {
			fail("seq %d received but neither applied nor held", q)
		}
	}
	start := int64(1)
	if p.FirstSeen == AcceptFirstSeen && len(tal.applied)+len(tal.lost) > 0 {
		start = min(slices.Min(append(slices.Clone(tal.applied), tal.lost...)), s.LastApplied+1)
	}
	inOrder := map[int64]bool{}
	for _, q := range tal.applied {
		inOrder[q] = true
	}
	for q := start; q <= s.LastApplied; q++ {
		if !inOrder[q] && !lost[q] {
			fail("seq %d below last_applied %d neither applied in order nor given up", q, s.LastApplied)
		}
	}
}
