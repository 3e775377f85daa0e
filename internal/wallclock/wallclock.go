// Package wallclock is the relay's and the consumer's wall clock, with a
// skew that fault tests set: ONCEFLOW_CLOCK_SKEW=+90s makes a binary read
// the time as ninety seconds ahead of the host's, as on a host whose clock
// is off. It is a test and fault-injection knob only, never a setting for
// production.
//
// libfaketime cannot do this for a Go binary: the Go runtime reads the clock
// through the kernel's vDSO, not through the C library that libfaketime
// intercepts. So each binary reads the variable once at start and hands the
// Clock to what stamps wall time (record timestamps, the consumer's
// timestamps); a skewed clock keeps its monotonic reading, so durations and
// timers are unaffected, as on a real host whose clock is merely set wrong.
//
// Nothing that decides anything (leases, retry times, gap deadlines,
// retention ages) reads this clock: those are on the database's clock
// (now()), which is why a skewed replica is harmless. The soak's clock-skew
// fault checks that (docs/reliability.md).
package wallclock

import (
	"fmt"
	"strings"
	"time"
)

// EnvVar is the environment variable read at start-up: a signed Go
// duration, e.g. "+90s", "-2m", "1h30m" (unsigned is ahead).
const EnvVar = "ONCEFLOW_CLOCK_SKEW"

// MaxSkew bounds the skew the variable may set.
const MaxSkew = 24 * time.Hour

// Clock is a wall clock skewed by a constant. The zero value is the host's
// clock.
type Clock struct {
	skew time.Duration
}

// Skewed returns the host's clock moved by skew.
func Skewed(skew time.Duration) Clock { return Clock{skew: skew} }

// Now is the host's time plus the skew. The monotonic reading is kept, so
// the difference of two Nows is the elapsed time.
func (c Clock) Now() time.Time {
	if c.skew == 0 {
		return time.Now()
	}
	return time.Now().Add(c.skew)
}

// Skew is the constant added to the host's time.
func (c Clock) Skew() time.Duration { return c.skew }

// FromEnv reads EnvVar through getenv (os.Getenv): unset or empty is the
// host's clock; anything else must parse as a duration within MaxSkew.
func FromEnv(getenv func(string) string) (Clock, error) {
	v := strings.TrimSpace(getenv(EnvVar))
	if v == "" {
		return Clock{}, nil
	}
	d, err := time.ParseDuration(strings.TrimPrefix(v, "+"))
	if err != nil {
		return Clock{}, fmt.Errorf("%s=%q: %w", EnvVar, v, err)
	}
	if d > MaxSkew || d < -MaxSkew {
		return Clock{}, fmt.Errorf("%s=%q: beyond ±%s", EnvVar, v, MaxSkew)
	}
	return Clock{skew: d}, nil
}
