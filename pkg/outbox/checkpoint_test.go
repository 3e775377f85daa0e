package outbox

import (
	"slices"
	"testing"
)

func TestCheckpointIDsRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ids  []int64
		want string
	}{
		{"empty", nil, "v1 "},
		{"one", []int64{7}, "v1 7"},
		{"range", []int64{1, 2, 3, 4}, "v1 1-4"},
		{"unsorted with gaps", []int64{12, 10, 11, 20, 22, 21, 30}, "v1 10-12,20-22,30"},
		{"duplicates", []int64{5, 5, 6}, "v1 5-6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := string(encodeIDs(tt.ids))
			if got != tt.want {
				t.Fatalf("encodeIDs(%v) = %q, want %q", tt.ids, got, tt.want)
			}
			back, err := decodeIDs([]byte(got))
			if err != nil {
				t.Fatal(err)
			}
			want := slices.Compact(slices.Sorted(slices.Values(tt.ids)))
			if !slices.Equal(back, want) && !(len(back) == 0 && len(want) == 0) {
				t.Fatalf("decodeIDs(%q) = %v, want %v", got, back, want)
			}
		})
	}
}

func TestCheckpointDecodeRejects(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "v2 1", "v1 x", "v1 5-3", "v1 1-", "v1 0-99999999"} {
		if _, err := decodeIDs([]byte(v)); err == nil {
			t.Errorf("decodeIDs(%q) accepted", v)
		}
	}
}

func FuzzCheckpointDecode(f *testing.F) {
	f.Add([]byte("v1 1-4,7"))
	f.Fuzz(func(t *testing.T, v []byte) {
		ids, err := decodeIDs(v)
		if err != nil {
			return
		}
		back, err := decodeIDs(encodeIDs(ids))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !slices.Equal(slices.Compact(slices.Sorted(slices.Values(ids))), back) && len(ids) > 0 {
			t.Fatalf("round trip %v -> %v", ids, back)
		}
	})
}
