package relay

import (
	"testing"
	"time"
)

// The gauges' refresh waits its interval, or ten times as long as the last
// refresh took when that is longer.
func TestStatsWait(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ took, want time.Duration }{
		{10 * time.Millisecond, 2 * time.Second},
		{200 * time.Millisecond, 2 * time.Second},
		{3 * time.Second, 30 * time.Second},
	} {
		if got := statsWait(2*time.Second, c.took); got != c.want {
			t.Errorf("statsWait(2s, %s) = %s, want %s", c.took, got, c.want)
		}
	}
}
