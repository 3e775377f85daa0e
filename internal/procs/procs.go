// Package procs supervises the named child processes of a chaos run (`make
// demo`, `make soak`): the relay and consumer binaries, each in its own
// process group with its output appended to a log file, started, SIGKILLed,
// paused with SIGSTOP and resumed with SIGCONT by name. Only processes it
// started are ever signalled.
package procs

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Spec is how to run a child.
type Spec struct {
	Bin  string
	Args []string
	// Env is added to the current environment.
	Env []string
}

// Set is a group of named children.
type Set struct {
	// LogDir receives <name>.log per child.
	LogDir string

	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	spec   Spec
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	paused bool
	starts int
}

// NewSet returns a Set logging into logDir (created if missing).
func NewSet(logDir string) (*Set, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	return &Set{LogDir: logDir, procs: map[string]*proc{}}, nil
}

// Start launches name with spec unless it is running. It reports whether
// a process was started.
func (s *Set) Start(name string, spec Spec) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked(name, &spec)
}

// Restart launches name again with the spec it last started with, unless
// it is running.
func (s *Set) Restart(name string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[name]
	if p == nil {
		return false, fmt.Errorf("%w: %s", ErrNotStarted, name)
	}
	return s.startLocked(name, nil)
}

func (s *Set) startLocked(name string, spec *Spec) (bool, error) {
	p := s.procs[name]
	if p != nil && p.running() {
		return false, nil
	}
	if p == nil {
		p = &proc{}
		s.procs[name] = p
	}
	if spec != nil {
		p.spec = *spec
	}
	logf, err := os.OpenFile(filepath.Join(s.LogDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return false, err
	}
	cmd := exec.Command(p.spec.Bin, p.spec.Args...)
	if len(p.spec.Env) > 0 {
		cmd.Env = append(os.Environ(), p.spec.Env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return false, fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.paused, p.err = cmd, done, false, nil
	p.starts++
	go func() {
		err := cmd.Wait()
		logf.Close()
		s.mu.Lock()
		if p.cmd == cmd {
			p.err = err
		}
		s.mu.Unlock()
		close(done)
	}()
	return true, nil
}

func (p *proc) running() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Running reports whether name's process is alive (paused counts).
func (s *Set) Running(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[name]
	return p != nil && p.running()
}

// PID of name's current process, 0 when it does not run.
func (s *Set) PID(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.procs[name]; p != nil && p.running() {
		return p.cmd.Process.Pid
	}
	return 0
}

// Starts is how often name was started.
func (s *Set) Starts(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.procs[name]; p != nil {
		return p.starts
	}
	return 0
}

// Exit is the last exit error of name (nil while running or after a clean
// exit).
func (s *Set) Exit(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.procs[name]; p != nil {
		return p.err
	}
	return nil
}

// Kill SIGKILLs name's process group and waits for the process to be gone.
// It reports whether it was running.
func (s *Set) Kill(name string) bool {
	s.mu.Lock()
	p := s.procs[name]
	if p == nil || !p.running() {
		s.mu.Unlock()
		return false
	}
	pid, done := p.cmd.Process.Pid, p.done
	s.mu.Unlock()
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-done
	return true
}

// Pause SIGSTOPs name's process group. It reports whether it was running
// and not paused.
func (s *Set) Pause(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[name]
	if p == nil || !p.running() || p.paused {
		return false
	}
	p.paused = true
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGSTOP)
	return true
}

// Resume SIGCONTs a paused process group.
func (s *Set) Resume(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[name]
	if p == nil || !p.running() || !p.paused {
		return false
	}
	p.paused = false
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT)
	return true
}

// StopAll resumes paused children, asks every child to drain (SIGTERM) and
// SIGKILLs those still running after grace. It returns the children that
// had to be killed.
func (s *Set) StopAll(grace time.Duration) []string {
	s.mu.Lock()
	type victim struct {
		name string
		pid  int
		done chan struct{}
	}
	var vs []victim
	for name, p := range s.procs {
		if !p.running() {
			continue
		}
		if p.paused {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT)
			p.paused = false
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		vs = append(vs, victim{name, p.cmd.Process.Pid, p.done})
	}
	s.mu.Unlock()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	expired := false
	var killed []string
	for _, v := range vs {
		if !expired {
			select {
			case <-v.done:
				continue
			case <-timer.C:
				expired = true
			}
		}
		select {
		case <-v.done:
		default:
			_ = syscall.Kill(-v.pid, syscall.SIGKILL)
			<-v.done
			killed = append(killed, v.name)
		}
	}
	return killed
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ErrNotStarted is returned for a name the Set never started.
var ErrNotStarted = errors.New("procs: not started")
