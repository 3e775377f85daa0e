package soak

import (
	"math"
	"sort"
	"time"
)

// FaultKindRow is one line of the per-fault-kind table: how many faults of
// the kind ran, how many events near them were lost, duplicated or
// reordered, and how long progress took to come back.
type FaultKindRow struct {
	Kind       string `json:"kind"`
	Faults     int    `json:"faults"`
	Lost       int    `json:"lost"`
	Duplicated int    `json:"duplicated"`
	Reordered  int    `json:"reordered"`
	Recovery   Stats  `json:"recovery"`
}

// NoFault is the row of the events that no fault began near.
const NoFault = "(no fault)"

// A broken event is put on the fault that began nearest to its commit,
// from attributeBefore before it (the fault struck while it was being
// published or applied) to attributeAfter after it (it was in flight).
const (
	attributeBefore = 60 * time.Second
	attributeAfter  = 30 * time.Second
)

// byFault attributes each lost, duplicated or reordered event (on the topic
// or in application, each event counted once per column) to a fault kind,
// and returns the table: the kinds that ran, in AllKinds order, and the
// no-fault row.
func byFault(l *ledger, tw *topicWatch, aw *appliedWatch, faults []Fault, start time.Time) []FaultKindRow {
	l.mu.Lock()
	committed := make(map[string]bool, len(l.committed))
	for id := range l.committed {
		committed[id] = true
	}
	l.mu.Unlock()
	lost := map[string]bool{}
	dup := map[string]bool{}
	reord := map[string]bool{}
	tw.mu.Lock()
	tl, _, _ := tw.seq.Diff(committed)
	for _, id := range tl {
		lost[id] = true
	}
	for _, id := range tw.dupeIDs {
		dup[id] = true
	}
	for _, id := range tw.reorderedIDs {
		reord[id] = true
	}
	tw.mu.Unlock()
	al, _, _ := aw.seq.Diff(committed)
	for _, id := range al {
		lost[id] = true
	}
	for _, id := range aw.dupeIDs {
		dup[id] = true
	}
	for _, id := range aw.reorderedIDs {
		reord[id] = true
	}

	sorted := append([]Fault(nil), faults...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].AtS < sorted[j].AtS })
	rows := map[string]*FaultKindRow{NoFault: {Kind: NoFault}}
	recov := map[string][]float64{}
	for _, f := range faults {
		r := rows[f.Kind]
		if r == nil {
			r = &FaultKindRow{Kind: f.Kind}
			rows[f.Kind] = r
		}
		r.Faults++
		if f.RecoveryS >= 0 {
			recov[f.Kind] = append(recov[f.Kind], f.RecoveryS)
		}
	}
	kindOf := func(id string) string {
		l.mu.Lock()
		ref, ok := l.committed[id]
		l.mu.Unlock()
		if !ok || ref.at.IsZero() {
			return NoFault
		}
		at := ref.at.Sub(start).Seconds()
		best, bestD := NoFault, math.Inf(1)
		// The faults that began in [at-before, at+after].
		i := sort.Search(len(sorted), func(i int) bool { return sorted[i].AtS >= at-attributeBefore.Seconds() })
		for ; i < len(sorted) && sorted[i].AtS <= at+attributeAfter.Seconds(); i++ {
			if d := math.Abs(sorted[i].AtS - at); d < bestD {
				best, bestD = sorted[i].Kind, d
			}
		}
		return best
	}
	for id := range lost {
		rows[kindOf(id)].Lost++
	}
	for id := range dup {
		rows[kindOf(id)].Duplicated++
	}
	for id := range reord {
		rows[kindOf(id)].Reordered++
	}
	var out []FaultKindRow
	for _, k := range AllKinds {
		if r := rows[k]; r != nil {
			r.Recovery = stats(recov[k])
			out = append(out, *r)
			delete(rows, k)
		}
	}
	var other []string // kinds not in AllKinds (none today)
	for k := range rows {
		if k != NoFault {
			other = append(other, k)
		}
	}
	sort.Strings(other)
	for _, k := range other {
		rows[k].Recovery = stats(recov[k])
		out = append(out, *rows[k])
	}
	return append(out, *rows[NoFault])
}
