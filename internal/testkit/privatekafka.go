package testkit

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
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

	java, props string
	jvm         []string
	cmd         *exec.Cmd
	done        chan struct{}
}

// StartPrivateKafka formats and starts a broker and stops it on cleanup.
func StartPrivateKafka(t testing.TB) *PrivateKafka {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	java, err := exec.LookPath(envOr("ONCEFLOW_JAVA", "java"))
	if err != nil {
		t.Fatal("private kafka: java not found: install the Debian package 'openjdk-17-jre-headless'")
	}
	cp, err := kafkaClasspath(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	k := &PrivateKafka{Brokers: fmt.Sprintf("127.0.0.1:%d", ports[0]), Dir: dir, java: java,
		props: filepath.Join(dir, "server.properties")}
	props := fmt.Sprintf(`process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:%[2]d
listeners=PLAINTEXT://127.0.0.1:%[1]d,CONTROLLER://127.0.0.1:%[2]d
advertised.listeners=PLAINTEXT://127.0.0.1:%[1]d
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=%[3]s
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=2
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=2
group.initial.rebalance.delay.ms=0
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
log.segment.bytes=67108864
`, ports[0], ports[1], filepath.Join(dir, "data"))
	if err := os.WriteFile(k.props, []byte(props), 0o600); err != nil {
		t.Fatal(err)
	}
	log4j := fmt.Sprintf("status = warn\nappender.file.type = File\nappender.file.name = file\nappender.file.fileName = %s\n"+
		"appender.file.layout.type = PatternLayout\nappender.file.layout.pattern = [%%d] %%p %%m (%%c)%%n\n"+
		"rootLogger.level = warn\nrootLogger.appenderRef.file.ref = file\n", filepath.Join(dir, "server.log"))
	if err := os.WriteFile(filepath.Join(dir, "log4j2.properties"), []byte(log4j), 0o644); err != nil {
		t.Fatal(err)
	}
	k.jvm = []string{"-Xms128m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(dir, "log4j2.properties"), "-cp", cp}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	format := append(append([]string{}, k.jvm...), "kafka.tools.StorageTool", "format",
		// "=" form: a base64url id may begin with "-", which the tool's
		// argument parser would take for an option.
		"--cluster-id="+base64.RawURLEncoding.EncodeToString(id), "-c", k.props)
	if out, err := exec.CommandContext(ctx, java, format...).CombinedOutput(); err != nil {
		t.Fatalf("private kafka: storage format: %v: %s", err, lastLinesOf(string(out), 5))
	}
	t.Cleanup(k.kill)
	if err := k.start(ctx); err != nil {
		t.Fatal(err)
	}
	return k
}

func (k *PrivateKafka) start(ctx context.Context) error {
	k.done = make(chan struct{})
	k.cmd = exec.Command(k.java, append(append([]string{}, k.jvm...), "kafka.Kafka", k.props)...)
	out, err := os.OpenFile(filepath.Join(k.Dir, "stdout.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	k.cmd.Stdout, k.cmd.Stderr = out, out
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := k.cmd.Start(); err != nil {
		return fmt.Errorf("private kafka: start: %v", err)
	}
	done := k.done
	go func() { _ = k.cmd.Wait(); close(done) }()
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
