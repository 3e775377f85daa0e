// Package failpoint lets fault tests kill, freeze or slow a real process at a
// chosen point.
//
// A binary calls Hit("relay-after-kafka-commit") at the places where a crash
// matters. When the environment variable ONCEFLOW_FAILPOINTS names that point,
// the process acts on itself there. The variable is a comma-separated list of
//
//	NAME            SIGKILL at the first hit
//	NAME=N          SIGKILL at the N-th hit
//	NAME=stop       SIGSTOP at the first hit (the test resumes it with SIGCONT)
//	NAME=N:stop     SIGSTOP at the N-th hit
//	NAME=delay:D    no action at Hit; Delay(NAME) returns the duration D
//
// SIGKILL is a crash: no deferred function runs, no buffer is flushed,
// exactly as if the machine had died. SIGSTOP freezes every goroutine at
// once, as a long GC pause or a frozen VM does; the process prints
// "failpoint NAME: SIGSTOP" first so that a test can wait for it, and the
// goroutine that hit the point goes on only after SIGCONT.
//
// With the variable unset, Hit costs one atomic load.
package failpoint

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// EnvVar is the environment variable read at start-up.
const EnvVar = "ONCEFLOW_FAILPOINTS"

type point struct {
	at    int64
	stop  bool
	delay time.Duration
	hits  atomic.Int64
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
		name, arg, _ := strings.Cut(item, "=")
		p := &point{at: 1}
		if d, ok := strings.CutPrefix(arg, "delay:"); ok {
			if v, err := time.ParseDuration(d); err == nil && v > 0 {
				p.delay = v
			}
			p.at = 0 // never acts at Hit
			points[name] = p
			continue
		}
		n, action, _ := strings.Cut(arg, ":")
		if n == "stop" {
			n, action = "", "stop"
		}
		if n != "" {
			if v, err := strconv.ParseInt(n, 10, 64); err == nil && v > 0 {
				p.at = v
			}
		}
		p.stop = action == "stop"
		points[name] = p
	}
	enabled.Store(len(points) > 0)
}

// Hit kills (or stops) the process if name is armed and this is its N-th hit.
func Hit(name string) {
	once.Do(load)
	if !enabled.Load() {
		return
	}
	p := points[name]
	if p == nil || p.at == 0 {
		return
	}
	if p.hits.Add(1) != p.at {
		return
	}
	if p.stop {
		// The stop reaches every thread a moment after kill returns: the
		// caller waits for SIGCONT, so that it cannot run on meanwhile.
		cont := make(chan os.Signal, 1)
		signal.Notify(cont, syscall.SIGCONT)
		defer signal.Stop(cont)
		os.Stderr.WriteString("failpoint " + name + ": SIGSTOP\n")
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		<-cont
		return
	}
	os.Stderr.WriteString("failpoint " + name + ": SIGKILL\n")
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never returns
}

// Delay is the duration armed for name with NAME=delay:D, or 0.
func Delay(name string) time.Duration {
	once.Do(load)
	if !enabled.Load() {
		return 0
	}
	if p := points[name]; p != nil {
		return p.delay
	}
	return 0
}
