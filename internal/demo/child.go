package demo

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type child struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// start launches the named child (relay-a, consumer-b, …) unless it runs.
func (r *run) start(ctx context.Context, name string) error {
	r.procMu.Lock()
	defer r.procMu.Unlock()
	if c := r.procs[name]; c != nil {
		select {
		case <-c.done:
		default:
			return nil // still running
		}
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	brokers := strings.Join(r.brokers, ",")
	var args []string
	kind, _, _ := strings.Cut(name, "-")
	switch kind {
	case "relay":
		args = []string{"run", "-database-url", r.dbURL, "-kafka-brokers", brokers,
			"-http-addr", fmt.Sprintf("127.0.0.1:%d", port), "-holder-id", name,
			"-lease-ttl", "2s", "-lease-renew-interval", "500ms", "-standby-interval", "250ms",
			"-checkpoint-topic", r.checkpointTopic, "-transactional-id-prefix", r.txnIDPrefix}
	case "consumer":
		args = []string{"run", "-database-url", r.dbURL, "-kafka-brokers", brokers,
			"-http-addr", fmt.Sprintf("127.0.0.1:%d", port), "-group", r.group,
			"-topics", r.topic, "-consumer-name", consumerN,
			// Static membership: a restarted replica takes its place in the
			// group at once instead of waiting out the dead one's session.
			"-instance-id", name,
			"-handlers-file", filepath.Join(r.logDir, "handlers.json")}
		if r.cfg.GapTimeout > 0 {
			args = append(args, "-gap-timeout", r.cfg.GapTimeout.String())
		}
	}
	logf, err := os.OpenFile(filepath.Join(r.logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(r.cfg.BinDir, kind), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(c.done) }()
	r.procs[name] = c
	return nil
}

// kill SIGKILLs a child and waits for it to be gone.
func (r *run) kill(name string) {
	r.procMu.Lock()
	c := r.procs[name]
	r.procMu.Unlock()
	if c == nil {
		return
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	<-c.done
}

// stopAll asks every child to drain (SIGTERM), then kills stragglers.
func (r *run) stopAll() {
	r.procMu.Lock()
	defer r.procMu.Unlock()
	for _, c := range r.procs {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(15 * time.Second)
	for _, c := range r.procs {
		select {
		case <-c.done:
		case <-deadline:
			_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.done
		}
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
