package outbox

import (
	"regexp"
	"testing"
	"time"
)

func TestNewEventIDIsTimeOrderedUUIDv7(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	prev := NewEventID()
	seen := map[string]bool{prev: true}
	for range 1000 {
		id := NewEventID()
		if !re.MatchString(id) {
			t.Fatalf("%q is not a UUID version 7", id)
		}
		if seen[id] {
			t.Fatalf("%q generated twice", id)
		}
		seen[id] = true
		// The first 48 bits are milliseconds: later ids never sort before
		// an earlier millisecond's.
		if id[:13] < prev[:13] {
			t.Fatalf("%q sorts before the earlier %q", id, prev)
		}
		prev = id
	}
	ms := time.Now().UnixMilli()
	id := NewEventID()
	var got int64
	for _, c := range id[:8] + id[9:13] {
		got = got<<4 | int64(hexVal(c))
	}
	if got < ms || got > ms+1000 {
		t.Fatalf("%q carries %d ms, want about %d", id, got, ms)
	}
}

func hexVal(c rune) int {
	if c >= 'a' {
		return int(c-'a') + 10
	}
	return int(c - '0')
}
