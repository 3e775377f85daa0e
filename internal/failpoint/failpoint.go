// Package failpoint lets fault tests kill a real process at a chosen point.
//
// A binary calls Hit("relay-after-kafka-commit") at the places where a crash
// matters. When the environment variable ONCEFLOW_FAILPOINTS names that point,
// the process sends itself SIGKILL there: no deferred function runs, no buffer
// is flushed, exactly as if the machine had died. The variable is a
// comma-separated list of NAME or NAME=N (die on the N-th hit, default 1).
//
// With the variable unset, Hit costs one atomic load.
package failpoint

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// EnvVar is the environment variable read at start-up.
const EnvVar = "ONCEFLOW_FAILPOINTS"

type point struct {
	at   int64
	hits atomic.Int64
}

var (
	once    sync.Once
	enabled atomic.Bool
	points  map[string]*point
)

func load() {
	spec := os.Getenv(EnvVar)
	if spec == "" {
		return
	}
	points = map[string]*point{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, n, _ := strings.Cut(item, "=")
		at := int64(1)
		if n != "" {
			if v, err := strconv.ParseInt(n, 10, 64); err == nil && v > 0 {
				at = v
			}
		}
		points[name] = &point{at: at}
	}
	enabled.Store(len(points) > 0)
}

// Hit kills the process with SIGKILL if name is armed and this is its N-th hit.
func Hit(name string) {
	once.Do(load)
	if !enabled.Load() {
		return
	}
	p := points[name]
	if p == nil {
		return
	}
	if p.hits.Add(1) == p.at {
		os.Stderr.WriteString("failpoint " + name + ": SIGKILL\n")
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never returns
	}
}
