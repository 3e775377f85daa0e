package wallclock

import (
	"testing"
	"time"
)

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want time.Duration
		err  bool
	}{
		{"", 0, false}, {"+90s", 90 * time.Second, false}, {"-2m", -2 * time.Minute, false},
		{"1h30m", 90 * time.Minute, false}, {" +5s ", 5 * time.Second, false},
		{"soon", 0, true}, {"+25h", 0, true}, {"-25h", 0, true},
	} {
		c, err := FromEnv(func(k string) string {
			if k != EnvVar {
				t.Fatalf("read %s", k)
			}
			return tc.v
		})
		if (err != nil) != tc.err || c.Skew() != tc.want {
			t.Errorf("%q: skew %s, err %v; want %s, error %v", tc.v, c.Skew(), err, tc.want, tc.err)
		}
	}
}

func TestSkewedNow(t *testing.T) {
	c := Skewed(-2 * time.Minute)
	before := time.Now()
	got := c.Now()
	after := time.Now()
	if got.Before(before.Add(-2*time.Minute)) || got.After(after.Add(-2*time.Minute)) {
		t.Fatalf("Now %s not two minutes behind [%s, %s]", got, before, after)
	}
	// The monotonic reading stays: elapsed time is not skewed.
	if d := c.Now().Sub(got); d < 0 || d > time.Second {
		t.Fatalf("elapsed %s between two skewed readings", d)
	}
	if d := got.Sub(before); d > 0 {
		t.Fatalf("a reading two minutes behind compares as %s after the host's", d)
	}
	if (Clock{}).Skew() != 0 {
		t.Fatal("the zero Clock is skewed")
	}
}
