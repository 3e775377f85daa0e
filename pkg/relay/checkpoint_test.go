package relay

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
)

func TestCheckpointV1RoundTrip(t *testing.T) {
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
			back, err := decodeCheckpoint([]byte(got))
			if err != nil {
				t.Fatal(err)
			}
			want := slices.Compact(slices.Sorted(slices.Values(tt.ids)))
			if !slices.Equal(back.ids, want) && !(len(back.ids) == 0 && len(want) == 0) {
				t.Fatalf("decode(%q) = %v, want %v", got, back.ids, want)
			}
			if back.db != "" || back.fps != nil {
				t.Fatalf("v1 decoded with db %q / fingerprints %v", back.db, back.fps)
			}
		})
	}
}

// A version 2 checkpoint carries the database identity and, per id, the
// fingerprint of the row's event id, in id order.
func TestCheckpointV2RoundTrip(t *testing.T) {
	t.Parallel()
	const db = "5f0c7a3e-9c1b-4c1e-8a53-0d4f3f2a9b10"
	rows := map[int64]uint32{}
	for _, id := range []int64{44, 12, 13, 14, 51, 52} {
		rows[id] = fingerprint(fmt.Sprintf("event-%d", id))
	}
	v := string(encodeCheckpoint(db, rows))
	if !strings.HasPrefix(v, "v2 db="+db+" ids=12-14,44,51-52 fp=") {
		t.Fatalf("encoded %q", v)
	}
	c, err := decodeCheckpoint([]byte(v))
	if err != nil {
		t.Fatal(err)
	}
	if c.db != db || !slices.Equal(c.ids, []int64{12, 13, 14, 44, 51, 52}) {
		t.Fatalf("decoded db %q ids %v", c.db, c.ids)
	}
	for i, id := range c.ids {
		if c.fps[i] != rows[id] {
			t.Fatalf("fingerprint of %d: %x, want %x", id, c.fps[i], rows[id])
		}
	}
	empty, err := decodeCheckpoint(encodeCheckpoint(db, nil))
	if err != nil || len(empty.ids) != 0 || empty.db != db {
		t.Fatalf("empty checkpoint: %+v %v", empty, err)
	}
}

func TestCheckpointDecodeRejects(t *testing.T) {
	t.Parallel()
	good := string(encodeCheckpoint("db-1", map[int64]uint32{1: 1, 2: 2}))
	for _, v := range []string{
		"", "v3 1", "v1 x", "v1 5-3", "v1 1-", "v1 0-99999999", "v1 5,3", "v1 1-4,3",
		"v2 ids=1-2 fp=AAAAAQAAAAI",                    // no db
		"v2 db=x ids=1-2",                              // no fingerprints
		"v2 db=x ids=1-2 fp=AAAAAQ",                    // fingerprints for one id of two
		"v2 db=x ids=1-2 fp=!!!",                       // not base64
		"v2 db=x db=y ids=1-2 fp=AAAAAQAAAAI",          // a field twice
		strings.Replace(good, "ids=1-2", "ids=2-1", 1), // bad range
	} {
		if _, err := decodeCheckpoint([]byte(v)); err == nil {
			t.Errorf("decodeCheckpoint(%q) accepted", v)
		}
	}
	if _, err := decodeCheckpoint([]byte(good)); err != nil {
		t.Errorf("decodeCheckpoint(%q): %v", good, err)
	}
}

func FuzzCheckpointDecode(f *testing.F) {
	f.Add([]byte("v1 1-4,7"))
	f.Add(encodeCheckpoint("db", map[int64]uint32{3: 9, 4: 10, 9: 1}))
	f.Fuzz(func(t *testing.T, v []byte) {
		c, err := decodeCheckpoint(v)
		if err != nil {
			return
		}
		if !slices.IsSorted(c.ids) || len(slices.Compact(slices.Clone(c.ids))) != len(c.ids) {
			t.Fatalf("ids not sorted and distinct: %v", c.ids)
		}
		if c.fps == nil {
			back, err := decodeCheckpoint(encodeIDs(c.ids))
			if err != nil || !slices.Equal(back.ids, c.ids) && len(c.ids) > 0 {
				t.Fatalf("v1 round trip %v -> %v (%v)", c.ids, back.ids, err)
			}
			return
		}
		if strings.ContainsAny(c.db, " ") || c.db == "" {
			return // not something the encoder writes
		}
		rows := map[int64]uint32{}
		for i, id := range c.ids {
			rows[id] = c.fps[i]
		}
		back, err := decodeCheckpoint(encodeCheckpoint(c.db, rows))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		got := map[int64]uint32{}
		for i, id := range back.ids {
			got[id] = back.fps[i]
		}
		if back.db != c.db || !maps.Equal(got, rows) {
			t.Fatalf("round trip %+v -> %+v", c, back)
		}
	})
}

// Errors that mean "Kafka will refuse this record again" are classified by
// reason; everything else is transient.
func TestRefusalClassification(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want string
	}{
		{kerr.MessageTooLarge, ReasonTooLarge},
		{fmt.Errorf("%w (uncompressed_bytes=9)", kerr.MessageTooLarge), ReasonTooLarge},
		{kerr.RecordListTooLarge, ReasonTooLarge},
		{kerr.InvalidTopicException, ReasonInvalidTopic},
		{kerr.TopicAuthorizationFailed, ReasonTopicAuthorization},
		{kerr.InvalidRecord, ReasonInvalidRecord},
		{kerr.InvalidTimestamp, ReasonInvalidRecord},
		{kerr.UnknownTopicOrPartition, ReasonTopicMissing},
		{kerr.NotLeaderForPartition, ""},
		{kerr.RequestTimedOut, ""},
		{kerr.InvalidProducerEpoch, ""},
		{errors.New("connection refused"), ""},
	}
	for _, tt := range tests {
		if got := refusal(tt.err); got != tt.want {
			t.Errorf("refusal(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
	for _, r := range setAsideReasons {
		want := r == ReasonTopicAuthorization || r == ReasonTopicMissing || r == ReasonTopicContract
		if retriedByRelay(r) != want {
			t.Errorf("retriedByRelay(%s) = %v", r, !want)
		}
	}
}

// isolate sends a suspect row alone and stops a batch before one, so the
// rows of a batch stay in id order.
func TestIsolate(t *testing.T) {
	t.Parallel()
	rows := func(spec string) []row {
		var out []row
		for i, c := range spec {
			w := row{id: int64(i + 1), topic: "t"}
			switch c {
			case 's':
				w.topic = "suspect"
			case 'r':
				w.retrying = true
			case 'i':
				w.topic = "bad topic"
			}
			out = append(out, w)
		}
		return out
	}
	tests := []struct {
		spec string
		want int
	}{
		{"....", 4},
		{"..s.", 2},
		{"s...", 1},
		{"r...", 1},
		{".r..", 1},
		{"i..", 1},
		{"..i", 2},
	}
	for _, tt := range tests {
		var s map[int64]refused
		if i := strings.IndexByte(tt.spec, 's'); i >= 0 {
			s = map[int64]refused{int64(i + 1): {reason: ReasonTooLarge}}
		}
		if got := len(isolate(rows(tt.spec), s)); got != tt.want {
			t.Errorf("isolate(%s) kept %d rows, want %d", tt.spec, got, tt.want)
		}
	}
}

// A version 2 checkpoint may carry hi: per stream, the highest seq among
// its rows and that row's id. Records written before hi existed still
// decode (no hi), and a record with hi still starts as relays before it
// read it.
func TestCheckpointHighs(t *testing.T) {
	t.Parallel()
	const db = "5f0c7a3e-9c1b-4c1e-8a53-0d4f3f2a9b10"
	set := newCkptSet(4)
	for _, w := range []row{
		{id: 10, eventID: "a", topic: "t", source: "s:1", seq: 4},
		{id: 11, eventID: "b", topic: "t", source: "s:1", seq: 5},
		{id: 12, eventID: "c", topic: "u", source: "s:1", seq: 1},
		{id: 13, eventID: "d", topic: "t", source: "ü, x", seq: 9},
	} {
		w.fp = fingerprint(w.eventID)
		set.add(w)
	}
	prev := newCkptSet(1)
	prev.add(row{id: 3, eventID: "z", topic: "t", source: "s:1", seq: 2, fp: fingerprint("z")})
	set.merge(prev)
	v := encodeCheckpointSet(db, set)
	if !strings.HasPrefix(string(v), "v2 db="+db+" ids=3,10-13 fp=") || !strings.Contains(string(v), " hi=") {
		t.Fatalf("encoded %q", v)
	}
	c, err := decodeCheckpoint(v)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(c.hi)
	want := fmt.Sprint([]streamHigh{
		{streamKey{"t", "s:1"}, 5, 11, fingerprint("b")},
		{streamKey{"t", "ü, x"}, 9, 13, fingerprint("d")},
		{streamKey{"u", "s:1"}, 1, 12, fingerprint("c")},
	})
	if got != want {
		t.Fatalf("hi %s, want %s", got, want)
	}
	// Today's records (no hi) and the legacy format still decode.
	old, err := decodeCheckpoint(encodeCheckpoint(db, set.fps))
	if err != nil || old.hi != nil || len(old.ids) != 5 {
		t.Fatalf("record without hi: %+v %v", old, err)
	}
	if v1, err := decodeCheckpoint([]byte("v1 4-6")); err != nil || v1.hi != nil {
		t.Fatalf("v1: %+v %v", v1, err)
	}
	for _, bad := range []string{" hi=", " hi=dA:cw:0:11", " hi=dA:cw:5:99", " hi=dA:cw:5", " hi=!!:cw:5:11", " hi=dA:cw:5:11,dA:cw:5:11,dA:cw:5:11,dA:cw:5:11,dA:cw:5:11,dA:cw:5:11"} {
		if _, err := decodeCheckpoint(append(encodeCheckpoint(db, set.fps), bad...)); err == nil {
			t.Errorf("decoded a record with%q", bad)
		}
	}
}
