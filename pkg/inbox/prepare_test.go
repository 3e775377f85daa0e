package inbox

import (
	"errors"
	"testing"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

func TestInOrder(t *testing.T) {
	t.Parallel()
	ev := func(source string, seq int64) item {
		return item{ev: Event{Envelope: envelope.Envelope{EventID: source + "-" + string(rune('0'+seq)), Source: source, Seq: seq, Producer: "p"}, Topic: "t"}}
	}
	n := func(v int64) *int64 { return &v }
	cases := []struct {
		name      string
		items     []item
		rows      []peekRow
		ordering  Ordering
		firstSeen seqguard.FirstSeen
		want      []bool
	}{
		{"next seqs of started streams, chained within the batch",
			[]item{ev("a", 5), ev("b", 1), ev("a", 6)}, []peekRow{{lastApplied: n(4)}, {lastApplied: n(0)}, {lastApplied: n(4)}},
			OrderSeq, seqguard.ExpectFirstSeq1, []bool{true, true, true}},
		{"ahead of a gap: it and the rest of its stream wait",
			[]item{ev("a", 6), ev("a", 5), ev("b", 2)}, []peekRow{{lastApplied: n(4)}, {lastApplied: n(4)}, {lastApplied: n(1)}},
			OrderSeq, seqguard.ExpectFirstSeq1, []bool{false, false, true}},
		{"an open gap, a duplicate, a late event",
			[]item{ev("a", 5), ev("b", 3), ev("c", 2)}, []peekRow{{lastApplied: n(4), openGap: true}, {lastApplied: n(2), known: true}, {lastApplied: n(7)}},
			OrderSeq, seqguard.ExpectFirstSeq1, []bool{false, false, false}},
		{"a new stream starts at 1, unless it may adopt a legacy state",
			[]item{ev("a", 1), ev("b", 1), ev("c", 3)}, []peekRow{{}, {legacy: n(9)}, {}},
			OrderSeq, seqguard.ExpectFirstSeq1, []bool{true, false, false}},
		{"accept-first-seen: a new stream's first event is left to the guard",
			[]item{ev("a", 3)}, []peekRow{{}},
			OrderSeq, seqguard.AcceptFirstSeen, []bool{false}},
		{"arrival order: everything not in the inbox",
			[]item{ev("a", 9), ev("a", 2), ev("b", 1)}, []peekRow{{}, {known: true}, {}},
			OrderArrival, seqguard.ExpectFirstSeq1, []bool{true, false, true}},
		{"a malformed record is skipped",
			[]item{{bad: errors.New("no source header")}, ev("a", 1)}, []peekRow{{}, {}},
			OrderSeq, seqguard.ExpectFirstSeq1, []bool{false, true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := inOrder(c.items, c.rows, c.ordering, c.firstSeen)
			for i := range c.want {
				if got[i] != c.want[i] {
					t.Fatalf("inOrder = %v, want %v", got, c.want)
				}
			}
		})
	}
}
