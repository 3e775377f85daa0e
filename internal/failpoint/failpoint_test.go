package failpoint

import (
	"testing"
	"time"
)

func TestSpec(t *testing.T) {
	t.Setenv(EnvVar, "kill, killat=3, froze=stop, frozeat=4:stop, slow=delay:2s, junk=delay:x")
	load()
	tests := []struct {
		name  string
		at    int64
		stop  bool
		delay time.Duration
	}{
		{"kill", 1, false, 0},
		{"killat", 3, false, 0},
		{"froze", 1, true, 0},
		{"frozeat", 4, true, 0},
		{"slow", 0, false, 2 * time.Second},
		{"junk", 0, false, 0},
	}
	for _, tt := range tests {
		p := points[tt.name]
		if p == nil || p.at != tt.at || p.stop != tt.stop || p.delay != tt.delay {
			t.Errorf("%s: %+v, want at %d stop %v delay %s", tt.name, p, tt.at, tt.stop, tt.delay)
		}
	}
	if Delay("slow") != 2*time.Second || Delay("kill") != 0 || Delay("absent") != 0 {
		t.Error("Delay")
	}
	Hit("slow") // a delay point never acts at Hit
	Hit("absent")
}
