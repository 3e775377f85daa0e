package testkit

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// PrivateKafka is a single-node PLAINTEXT Kafka (KRaft) owned by one test,
// for fault tests that stop or restart the broker without disturbing the
// shared one. It keeps its ports and data across Restart.
type PrivateKafka struct {
	// Brokers is the client listener, 127.0.0.1:port.
	Brokers string
	Dir     string

	node *kafkaNode
	cmd  *exec.Cmd
	done chan struct{}
}

// StartPrivateKafka formats and starts a broker and stops it on cleanup.
func StartPrivateKafka(t testing.TB) *PrivateKafka {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	k := &PrivateKafka{Brokers: fmt.Sprintf("127.0.0.1:%d", ports[0]), Dir: dir}
	listeners := fmt.Sprintf(`listeners=PLAINTEXT://127.0.0.1:%[1]d,CONTROLLER://127.0.0.1:%[2]d
advertised.listeners=PLAINTEXT://127.0.0.1:%[1]d
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
`, ports[0], ports[1])
	if k.node, err = prepareKafkaNode(ctx, dir, listeners, ports[1], "384m"); err != nil {
		t.Fatalf("private kafka: %v", err)
	}
	t.Cleanup(k.kill)
	if err := k.start(ctx); err != nil {
		t.Fatal(err)
	}
	return k
}

func (k *PrivateKafka) start(ctx context.Context) error {
	var err error
	if k.cmd, k.done, err = k.node.start(); err != nil {
		return fmt.Errorf("private kafka: %w", err)
	}
	done := k.done
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := cl.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return errors.New("private kafka exited during start: see " + filepath.Join(k.Dir, "stdout.log"))
		case <-ctx.Done():
			return fmt.Errorf("private kafka did not answer: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Restart stops the broker (SIGTERM, a controlled shutdown) and starts it
// again on the same ports and data.
func (k *PrivateKafka) Restart(ctx context.Context) error {
	_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-k.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return k.start(ctx)
}

func (k *PrivateKafka) kill() {
	if k.cmd != nil && k.cmd.Process != nil {
		_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.done
	}
}
