package reconcile

import (
	"math/rand/v2"
	"testing"
)

// TestSetMatchesAMap: a Set built from seqs in any order holds exactly the
// seqs a map would, and Minus/Intersect agree with the map's answers.
func TestSetMatchesAMap(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var a, b Set
		ma, mb := map[int64]bool{}, map[int64]bool{}
		for range rng.IntN(60) {
			from := rng.Int64N(80) + 1
			to := from + rng.Int64N(4)
			if rng.IntN(3) == 0 {
				to = from
			}
			a.AddRange(from, to)
			for v := from; v <= to; v++ {
				ma[v] = true
			}
			v := rng.Int64N(80) + 1
			b.Add(v)
			mb[v] = true
		}
		check := func(name string, s *Set, want func(int64) bool) {
			t.Helper()
			var n int64
			for v := int64(0); v <= 90; v++ {
				if s.Contains(v) != want(v) {
					t.Fatalf("round %d: %s: Contains(%d) = %v, want %v (set %s)", round, name, v, s.Contains(v), want(v), s)
				}
				if want(v) {
					n++
				}
			}
			if s.Len() != n {
				t.Fatalf("round %d: %s: Len %d, want %d", round, name, s.Len(), n)
			}
			for i, r := range s.All() {
				if r.From > r.To || (i > 0 && s.All()[i-1].To+1 >= r.From) {
					t.Fatalf("round %d: %s: ranges not sorted, disjoint and apart: %s", round, name, s)
				}
			}
		}
		check("a", &a, func(v int64) bool { return ma[v] })
		check("b", &b, func(v int64) bool { return mb[v] })
		check("a-b", a.Minus(&b), func(v int64) bool { return ma[v] && !mb[v] })
		check("a&b", a.Intersect(&b), func(v int64) bool { return ma[v] && mb[v] })
	}
}

// TestSetMemoryIsTheHoles: a million seqs in order with every thousandth
// missing take a thousand ranges, and a gap-free million one.
func TestSetMemoryIsTheHoles(t *testing.T) {
	t.Parallel()
	var full, holes Set
	for v := int64(1); v <= 1_000_000; v++ {
		full.Add(v)
		if v%1000 != 0 {
			holes.Add(v)
		}
	}
	if full.Ranges() != 1 || full.Len() != 1_000_000 {
		t.Errorf("gap-free: %d ranges, %d seqs; want 1 and 1000000", full.Ranges(), full.Len())
	}
	if holes.Ranges() != 1000 || holes.Len() != 999_000 {
		t.Errorf("holes: %d ranges, %d seqs; want 1000 and 999000", holes.Ranges(), holes.Len())
	}
	if got := full.Minus(&holes); got.Len() != 1000 || got.Ranges() != 1000 {
		t.Errorf("full-holes: %d seqs in %d ranges, want 1000 in 1000", got.Len(), got.Ranges())
	}
}
