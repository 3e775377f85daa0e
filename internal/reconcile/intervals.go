package reconcile

import (
	"fmt"
	"slices"
	"strings"
)

// Range is the seqs From..To of a stream, both included.
type Range struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

func (r Range) String() string {
	if r.From == r.To {
		return fmt.Sprint(r.From)
	}
	return fmt.Sprintf("%d-%d", r.From, r.To)
}

// Set is a set of seqs kept as sorted, disjoint, non-adjacent ranges: its
// memory grows with the number of holes, not with the number of seqs. A
// stream read in seq order (what every query of reconcile returns) adds
// each seq in O(1); an out-of-order seq costs a binary search and, at
// worst, one shift of the ranges after it.
type Set struct {
	rs []Range
}

// Add adds one seq.
func (s *Set) Add(seq int64) { s.AddRange(seq, seq) }

// AddRange adds the seqs from..to (nothing when from > to).
func (s *Set) AddRange(from, to int64) {
	if from > to {
		return
	}
	n := len(s.rs)
	// The fast path: at or after the last range.
	if n == 0 || from > s.rs[n-1].To+1 {
		s.rs = append(s.rs, Range{from, to})
		return
	}
	if from >= s.rs[n-1].From {
		s.rs[n-1].To = max(s.rs[n-1].To, to)
		return
	}
	// The first range that ends at or after from-1 (may merge with it).
	i, _ := slices.BinarySearchFunc(s.rs, from-1, func(r Range, v int64) int {
		switch {
		case r.To < v:
			return -1
		case r.To > v:
			return 1
		}
		return 0
	})
	// The ranges i..j-1 touch or overlap [from, to].
	j := i
	for j < n && s.rs[j].From <= to+1 {
		j++
	}
	if i == j {
		s.rs = slices.Insert(s.rs, i, Range{from, to})
		return
	}
	merged := Range{min(from, s.rs[i].From), max(to, s.rs[j-1].To)}
	s.rs[i] = merged
	s.rs = slices.Delete(s.rs, i+1, j)
}

// Contains reports whether seq is in the set.
func (s *Set) Contains(seq int64) bool {
	_, found := slices.BinarySearchFunc(s.rs, seq, func(r Range, v int64) int {
		switch {
		case r.To < v:
			return -1
		case r.From > v:
			return 1
		}
		return 0
	})
	return found
}

// Len is the number of seqs in the set.
func (s *Set) Len() int64 {
	var n int64
	for _, r := range s.rs {
		n += r.To - r.From + 1
	}
	return n
}

// Ranges is the number of ranges the set keeps (its memory, at 16 bytes
// each).
func (s *Set) Ranges() int { return len(s.rs) }

// Empty reports whether the set has no seq.
func (s *Set) Empty() bool { return len(s.rs) == 0 }

// All returns the ranges in order (the set's own slice: do not modify).
func (s *Set) All() []Range { return s.rs }

// Minus returns the seqs of s that are in none of others.
func (s *Set) Minus(others ...*Set) *Set {
	out := &Set{rs: slices.Clone(s.rs)}
	for _, o := range others {
		if o == nil || o.Empty() || out.Empty() {
			continue
		}
		out = out.minus(o)
	}
	return out
}

func (s *Set) minus(o *Set) *Set {
	out := &Set{}
	j := 0
	for _, r := range s.rs {
		from := r.From
		for j < len(o.rs) && o.rs[j].To < from {
			j++
		}
		k := j
		for k < len(o.rs) && o.rs[k].From <= r.To {
			if o.rs[k].From > from {
				out.rs = append(out.rs, Range{from, o.rs[k].From - 1})
			}
			from = max(from, o.rs[k].To+1)
			k++
		}
		if from <= r.To {
			out.rs = append(out.rs, Range{from, r.To})
		}
	}
	return out
}

// Intersect returns the seqs in both s and o.
func (s *Set) Intersect(o *Set) *Set {
	return s.Minus(s.Minus(o))
}

// String lists the ranges: "1-3,7".
func (s *Set) String() string {
	parts := make([]string, len(s.rs))
	for i, r := range s.rs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}
