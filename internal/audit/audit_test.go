package audit

import (
	"reflect"
	"testing"
)

func TestSequence(t *testing.T) {
	t.Parallel()
	type ev struct {
		id, src string
		seq     int64
	}
	cases := []struct {
		name                         string
		stream                       []ev
		committed                    []string
		lost, dup, phantom, disorder []string
	}{
		{name: "clean", stream: []ev{{"a1", "a", 1}, {"b1", "b", 1}, {"a2", "a", 2}}, committed: []string{"a1", "a2", "b1"}},
		{name: "lost", stream: []ev{{"a1", "a", 1}}, committed: []string{"a1", "a2"}, lost: []string{"a2"}},
		{
			name:   "duplicate is not disorder",
			stream: []ev{{"a1", "a", 1}, {"a2", "a", 2}, {"a1", "a", 1}}, committed: []string{"a1", "a2"},
			dup: []string{"a1"},
		},
		{
			name:   "reordered",
			stream: []ev{{"a2", "a", 2}, {"a1", "a", 1}, {"a3", "a", 3}}, committed: []string{"a1", "a2", "a3"},
			disorder: []string{"a: seq 1 after seq 2"},
		},
		{name: "phantom", stream: []ev{{"x", "a", 1}}, committed: nil, phantom: []string{"x"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := NewSequence()
			for _, e := range c.stream {
				s.Add(e.id, e.src, e.seq)
			}
			committed := map[string]bool{}
			for _, id := range c.committed {
				committed[id] = true
			}
			lost, dup, phantom := s.Diff(committed)
			for _, got := range []struct {
				what      string
				got, want []string
			}{{"lost", lost, c.lost}, {"duplicated", dup, c.dup}, {"phantom", phantom, c.phantom}, {"out of order", s.OutOfOrder, c.disorder}} {
				if len(got.got) != 0 || len(got.want) != 0 {
					if !reflect.DeepEqual(got.got, got.want) {
						t.Errorf("%s = %v, want %v", got.what, got.got, got.want)
					}
				}
			}
			if s.Total != len(c.stream) {
				t.Errorf("total %d", s.Total)
			}
		})
	}
}
