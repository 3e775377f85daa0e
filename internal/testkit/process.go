package testkit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// Binary builds the named command (cmd/<name>) once per test process and
// returns the path of the executable.
func Binary(t testing.TB, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		buildDir, err = os.MkdirTemp("", "onceflow-bin-")
		if err != nil {
			buildErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+string(os.PathSeparator), "./cmd/...", "./cmd/demo")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/... ./cmd/demo: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build binaries: %v", buildErr)
	}
	p := filepath.Join(buildDir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("binary %s: %v", name, err)
	}
	return p
}

// Build builds the main packages pkgs (patterns relative to the repository
// root, e.g. "./cmd/relay", "./examples/orders/cmd/...") into a directory
// of the test's and returns it: the executables are named after their
// packages' directories.
func Build(t testing.TB, pkgs ...string) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatalf("build %v: %v", pkgs, err)
	}
	dir := t.TempDir()
	cmd := exec.Command("go", append([]string{"build", "-o", dir + string(os.PathSeparator)}, pkgs...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", pkgs, err, out)
	}
	return dir
}

// Proc is a running binary whose output goes to the test log.
type Proc struct {
	t     testing.TB
	Name  string
	Cmd   *exec.Cmd
	done  chan struct{}
	err   error
	mu    sync.Mutex
	lines []string
	wake  chan struct{}
}

// Start runs bin with args and env (added to the current environment). Its
// stdout and stderr are copied to the test log prefixed with name. The process
// is SIGKILLed on cleanup if still running.
func Start(t testing.TB, name, bin string, env []string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw := io.Pipe()
	cmd.Stdout = pw
	cmd.Stderr = pw
	p := &Proc{t: t, Name: name, Cmd: cmd, done: make(chan struct{}), wake: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.lines = append(p.lines, line)
			close(p.wake)
			p.wake = make(chan struct{})
			p.mu.Unlock()
			if testing.Verbose() || os.Getenv("ONCEFLOW_TEST_PROCESS_LOGS") != "" {
				t.Logf("[%s] %s", name, line)
			}
		}
	}()
	go func() {
		p.err = cmd.Wait()
		pw.Close()
		<-scanned // every line is in p.lines before Done closes
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() && !testing.Verbose() && os.Getenv("ONCEFLOW_TEST_PROCESS_LOGS") == "" {
			p.logNotable(t)
		}
	})
	return p
}

// notableMax bounds the lines logNotable prints.
const notableMax = 200

// logNotable puts the process's warnings and errors (the last notableMax)
// in the log of a test that failed, where CI shows them: the evidence of
// what the process did is otherwise gone with it.
func (p *Proc) logNotable(t testing.TB) {
	p.mu.Lock()
	var notable []string
	for _, l := range p.lines {
		if strings.Contains(l, " WARN ") || strings.Contains(l, " ERROR ") || strings.Contains(l, "panic") {
			notable = append(notable, l)
		}
	}
	p.mu.Unlock()
	if len(notable) > notableMax {
		t.Logf("[%s] (%d earlier warnings and errors left out)", p.Name, len(notable)-notableMax)
		notable = notable[len(notable)-notableMax:]
	}
	for _, l := range notable {
		t.Logf("[%s] %s", p.Name, l)
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() {
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) { _ = p.Cmd.Process.Signal(sig) }

// Wait waits for exit up to timeout and returns the exit error.
func (p *Proc) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		return fmt.Errorf("%s still running after %s", p.Name, timeout)
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Output is everything the process printed so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// WaitFor waits until a line matching re has been printed, the process exits,
// or ctx ends.
func (p *Proc) WaitFor(ctx context.Context, re *regexp.Regexp) (string, error) {
	seen := 0
	for {
		p.mu.Lock()
		for ; seen < len(p.lines); seen++ {
			if re.MatchString(p.lines[seen]) {
				l := p.lines[seen]
				p.mu.Unlock()
				return l, nil
			}
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-p.done:
			p.mu.Lock()
			n := len(p.lines)
			p.mu.Unlock()
			if seen >= n {
				return "", fmt.Errorf("%s exited (%v) before printing %s", p.Name, p.err, re)
			}
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for %s in %s output: %w", re, p.Name, ctx.Err())
		}
	}
}
