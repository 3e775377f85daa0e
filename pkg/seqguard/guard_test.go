package seqguard

import (
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

// op is one input to the state machine: a received seq, or a tick (seq 0).
type op struct {
	seq int64
	sec int // clock, seconds after t0
	pol *Policy
}

func recv(seq int64, sec int) op { return op{seq: seq, sec: sec} }
func tick(sec int) op            { return op{sec: sec} }

func render(steps []Step) string {
	var b []string
	for _, s := range steps {
		b = append(b, s.String())
	}
	return strings.Join(b, "; ")
}

func TestGuard(t *testing.T) {
	t.Parallel()
	def := Policy{}.WithDefaults()
	cases := []struct {
		name   string
		policy Policy
		ops    []op
		want   []string // rendered steps per op
		last   int64    // LastApplied at the end
	}{
		{
			name: "in order",
			ops:  []op{recv(1, 0), recv(2, 0), recv(3, 0)},
			want: []string{"apply 1", "apply 2", "apply 3"},
			last: 3,
		},
		{
			name: "5 before 4 parks then applies in order, no give-up",
			ops:  []op{recv(1, 0), recv(2, 0), recv(3, 0), recv(5, 1), recv(4, 2), tick(100)},
			want: []string{"apply 1", "apply 2", "apply 3", "park 5; gap-opened 4-4", "apply 4; gap-filled 4-4; apply 5 parked", ""},
			last: 5,
		},
		{
			name: "expect-first-seq-1 parks a first event above 1",
			ops:  []op{recv(5, 0), recv(1, 1)},
			want: []string{"park 5; gap-opened 1-4", "apply 1; gap-narrowed 1-4 -> [2-4]"},
			last: 1,
		},
		{
			name:   "accept-first-seen starts where the source is first seen",
			policy: Policy{FirstSeen: AcceptFirstSeen},
			ops:    []op{recv(5, 0), recv(6, 0), recv(3, 0)},
			want:   []string{"apply 5", "apply 6", "apply 3 late"},
			last:   6,
		},
		{
			name: "timeout gives up the gap once and applies parked 8-10 in order",
			ops: []op{recv(1, 0), recv(2, 0), recv(3, 0), recv(4, 0), recv(5, 0), recv(6, 0),
				recv(8, 0), recv(9, 1), recv(10, 2), tick(29), tick(30), tick(31), recv(7, 40)},
			want: []string{"apply 1", "apply 2", "apply 3", "apply 4", "apply 5", "apply 6",
				"park 8; gap-opened 7-7", "park 9", "park 10", "",
				"gap-given-up 7-7 (timeout); apply 8 parked; apply 9 parked; apply 10 parked", "", "apply 7 late"},
			last: 10,
		},
		{
			name: "a redelivered seq applied in order is a duplicate, one in a given-up range is late",
			ops:  []op{recv(1, 0), recv(2, 0), recv(4, 0), tick(30), recv(1, 31), recv(2, 31), recv(4, 31), recv(3, 31)},
			want: []string{"apply 1", "apply 2", "park 4; gap-opened 3-3", "gap-given-up 3-3 (timeout); apply 4 parked",
				"duplicate 1", "duplicate 2", "duplicate 4", "apply 3 late"},
			last: 4,
		},
		{
			name:   "hold: a duplicate is not held",
			policy: Policy{Late: Hold},
			ops:    []op{recv(1, 0), recv(2, 0), recv(1, 1)},
			want:   []string{"apply 1", "apply 2", "duplicate 1"},
			last:   2,
		},
		{
			name:   "accept-first-seen: below the first seq is late, above it a duplicate",
			policy: Policy{FirstSeen: AcceptFirstSeen},
			ops:    []op{recv(5, 0), recv(6, 0), recv(4, 0), recv(5, 0)},
			want:   []string{"apply 5", "apply 6", "apply 4 late", "duplicate 5"},
			last:   6,
		},
		{
			name:   "late event held",
			policy: Policy{Late: Hold},
			ops:    []op{recv(2, 0), tick(30), recv(1, 31)},
			want:   []string{"park 2; gap-opened 1-1", "gap-given-up 1-1 (timeout); apply 2 parked", "hold 1"},
			last:   2,
		},
		{
			name: "fill splits a gap keeping opened_at and deadline",
			ops:  []op{recv(8, 0), recv(5, 10), recv(1, 11), recv(2, 11), recv(3, 11), recv(4, 11)},
			want: []string{"park 8; gap-opened 1-7", "park 5; gap-narrowed 1-7 -> [1-4 6-7]",
				"apply 1; gap-narrowed 1-4 -> [2-4]", "apply 2; gap-narrowed 2-4 -> [3-4]",
				"apply 3; gap-narrowed 3-4 -> [4-4]", "apply 4; gap-filled 4-4; apply 5 parked"},
			last: 5,
		},
		{
			name: "fill at a gap's edge narrows it",
			ops:  []op{recv(8, 0), recv(7, 1), recv(2, 1)},
			want: []string{"park 8; gap-opened 1-7", "park 7; gap-narrowed 1-7 -> [1-6]", "park 2; gap-narrowed 1-6 -> [1-1 3-6]"},
			last: 0,
		},
		{
			name: "gaps are given up in seq order",
			ops:  []op{recv(2, 0), recv(4, 10), tick(30), tick(39), tick(40)},
			want: []string{"park 2; gap-opened 1-1", "park 4; gap-opened 3-3",
				"gap-given-up 1-1 (timeout); apply 2 parked", "", "gap-given-up 3-3 (timeout); apply 4 parked"},
			last: 4,
		},
		{
			name: "a shorter timeout above a longer one waits for it",
			ops: []op{recv(2, 0), {seq: 4, sec: 1, pol: &Policy{GapTimeout: time.Second, MaxParked: 10}},
				tick(5), tick(30)},
			want: []string{"park 2; gap-opened 1-1", "park 4; gap-opened 3-3", "",
				"gap-given-up 1-1 (timeout); apply 2 parked; gap-given-up 3-3 (timeout); apply 4 parked"},
			last: 4,
		},
		{
			name:   "max parked gives up the lowest gap early",
			policy: Policy{MaxParked: 2},
			ops:    []op{recv(3, 0), recv(4, 0), recv(6, 0), recv(9, 0)},
			want: []string{"park 3; gap-opened 1-2", "park 4", "park 6; gap-opened 5-5; gap-given-up 1-2 (max_parked); apply 3 parked; apply 4 parked",
				"park 9; gap-opened 7-8"},
			last: 4,
		},
		{
			name:   "max parked applying the received event itself",
			policy: Policy{MaxParked: 1},
			ops:    []op{recv(3, 0), recv(2, 0)},
			want:   []string{"park 3; gap-opened 1-2", "gap-narrowed 1-2 -> [1-1]; gap-given-up 1-1 (max_parked); apply 2; apply 3 parked"},
			last:   3,
		},
		{
			name: "a second event with a parked seq is a conflict",
			ops:  []op{recv(3, 0), recv(3, 1)},
			want: []string{"park 3; gap-opened 1-2", "seq-conflict 3"},
			last: 0,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := def
			if tc.policy != (Policy{}) {
				p = tc.policy.WithDefaults()
			}
			var s State
			for i, o := range tc.ops {
				var steps []Step
				if o.seq == 0 {
					s, steps = s.Tick(at(o.sec))
				} else {
					pp := p
					if o.pol != nil {
						pp = *o.pol
					}
					var err error
					s, steps, err = s.Receive(o.seq, at(o.sec), pp)
					if err != nil {
						t.Fatalf("op %d: %v", i, err)
					}
				}
				if got := render(steps); got != tc.want[i] {
					t.Errorf("op %d (%+v):\n got %q\nwant %q", i, o, got, tc.want[i])
				}
				if err := s.Validate(); err != nil {
					t.Fatalf("op %d: invalid state %+v: %v", i, s, err)
				}
			}
			if s.LastApplied != tc.last {
				t.Errorf("LastApplied = %d, want %d", s.LastApplied, tc.last)
			}
		})
	}
}

func TestCount(t *testing.T) {
	t.Parallel()
	p := Policy{MaxParked: 2}.WithDefaults()
	var all []Step
	s := State{}
	for _, seq := range []int64{3, 4, 6} { // the third gives up 1-2 early
		var steps []Step
		s, steps, _ = s.Receive(seq, t0, p)
		all = append(all, steps...)
	}
	_, steps, _ := s.Receive(1, t0, p)
	all = append(all, steps...)
	want := Counts{Applied: 2, Late: 1, Parked: 3, GapsOpened: 2, GapsGivenUp: 1}
	if got := Count(all); got != want {
		t.Errorf("Count = %+v, want %+v", got, want)
	}
}

func TestGapMetadataSurvivesSplit(t *testing.T) {
	t.Parallel()
	p := Policy{}.WithDefaults()
	s, _, _ := State{}.Receive(8, at(0), p)
	s, _, _ = s.Receive(5, at(20), p)
	if len(s.Gaps) != 2 {
		t.Fatalf("gaps %v", s.Gaps)
	}
	for _, g := range s.Gaps {
		if !g.OpenedAt.Equal(at(0)) || !g.Deadline.Equal(at(30)) {
			t.Errorf("gap %v: opened %v deadline %v, want the original", g, g.OpenedAt, g.Deadline)
		}
	}
	if d, ok := s.NextDeadline(); !ok || !d.Equal(at(30)) {
		t.Errorf("NextDeadline = %v %v", d, ok)
	}
	if _, ok := (State{}).NextDeadline(); ok {
		t.Error("NextDeadline of an empty state reports a deadline")
	}
}

func TestReceiveLeavesReceiverUntouched(t *testing.T) {
	t.Parallel()
	p := Policy{}.WithDefaults()
	s, _, _ := State{}.Receive(3, at(0), p)
	s, _, _ = s.Receive(6, at(0), p)
	before := s.clone()
	_, _, _ = s.Receive(4, at(1), p)
	_, _, _ = s.Receive(1, at(1), p)
	_, _ = s.Tick(at(100))
	if s.LastApplied != before.LastApplied || !slices.Equal(s.Parked, before.Parked) || !slices.Equal(s.Gaps, before.Gaps) {
		t.Errorf("receiver changed: %+v, was %+v", s, before)
	}
}

func TestReceiveRejectsBadSeq(t *testing.T) {
	t.Parallel()
	for _, seq := range []int64{0, -1} {
		if _, _, err := (State{}).Receive(seq, t0, Policy{}.WithDefaults()); err != ErrInvalidSeq {
			t.Errorf("seq %d: err %v, want ErrInvalidSeq", seq, err)
		}
	}
}

func TestPolicy(t *testing.T) {
	t.Parallel()
	cases := []struct {
		p       Policy
		wantErr string
	}{
		{Policy{}.WithDefaults(), ""},
		{Policy{GapTimeout: -time.Second, MaxParked: 1}, "GapTimeout"},
		{Policy{GapTimeout: time.Second}, "MaxParked"},
		{Policy{FirstSeen: 7, GapTimeout: time.Second, MaxParked: 1}, "FirstSeen"},
		{Policy{Late: 7, GapTimeout: time.Second, MaxParked: 1}, "Late"},
	}
	for _, tc := range cases {
		err := tc.p.Validate()
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("Validate(%+v) = %v, want error naming %q", tc.p, err, tc.wantErr)
		}
	}
	d := Policy{}.WithDefaults()
	if d.GapTimeout != 30*time.Second || d.MaxParked != DefaultMaxParked || d.FirstSeen != ExpectFirstSeq1 || d.Late != DeliverLate {
		t.Errorf("defaults %+v", d)
	}
	for _, s := range []string{"expect-first-seq-1", "accept-first-seen"} {
		if f, err := ParseFirstSeen(s); err != nil || f.String() != s {
			t.Errorf("ParseFirstSeen(%q) = %v, %v", s, f, err)
		}
	}
	for _, s := range []string{"deliver-late", "hold"} {
		if l, err := ParseLate(s); err != nil || l.String() != s {
			t.Errorf("ParseLate(%q) = %v, %v", s, l, err)
		}
	}
	if _, err := ParseLate("drop"); err == nil {
		t.Error("ParseLate accepted drop")
	}
	if _, err := ParseFirstSeen("x"); err == nil {
		t.Error("ParseFirstSeen accepted x")
	}
}

// TestCoreImportsNoIO keeps the decision logic free of I/O packages.
func TestCoreImportsNoIO(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "guard.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{"fmt": true, "slices": true, "time": true}
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if !allowed[path] {
			t.Errorf("guard.go imports %s; the pure core may use only %v", path, allowed)
		}
	}
}

// TestUnknownFirst: a source started before its first seq was recorded
// (First 0) is taken to have started at 1 under expect-first-seq-1; under
// accept-first-seen every seq at or below last_applied outside a given-up
// range is late rather than a duplicate, so nothing is dropped.
func TestUnknownFirst(t *testing.T) {
	t.Parallel()
	old := State{Started: true, LastApplied: 9}
	_, steps, err := old.Receive(3, t0, Policy{}.WithDefaults())
	if err != nil || render(steps) != "duplicate 3" {
		t.Fatalf("expect-first-seq-1: %s, %v", render(steps), err)
	}
	_, steps, err = old.Receive(3, t0, Policy{FirstSeen: AcceptFirstSeen}.WithDefaults())
	if err != nil || render(steps) != "apply 3 late" {
		t.Fatalf("accept-first-seen: %s, %v", render(steps), err)
	}
}

// A gap an operator asked to give up goes with ReasonOperator; a gap below it
// whose deadline passed on its own goes with ReasonTimeout.
func TestTickOperatorReason(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := State{Started: true, First: 1, LastApplied: 1, Parked: []int64{3, 5},
		Gaps: []Gap{{From: 2, To: 2, Deadline: now}, {From: 4, To: 4, Deadline: now, GiveUpBy: "bob via api:ops"}}}
	_, steps := s.Tick(now)
	var got []string
	for _, st := range steps {
		if st.Kind == StepGapGivenUp {
			got = append(got, st.Gap.String()+" "+string(st.Reason))
		}
	}
	if want := []string{"2-2 timeout", "4-4 operator"}; !slices.Equal(got, want) {
		t.Fatalf("given up %v, want %v", got, want)
	}
}
