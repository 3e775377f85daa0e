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
)

// kafkaNode is a single-node KRaft broker prepared in a directory of its own:
// the launcher shared by PrivateKafka and SecureKafka (scripts/services.sh
// starts the shared test broker the same way, in shell).
type kafkaNode struct {
	dir, java, props string
	jvm              []string
}

// brokerCommonProps are the settings every test broker shares: one node
// acting as broker and controller, no auto-created topics, replication
// factor 1 for the internal topics, no initial rebalance delay.
func brokerCommonProps(dataDir string, controllerPort int) string {
	return fmt.Sprintf(`process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:%d
controller.listener.names=CONTROLLER
log.dirs=%s
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
group.initial.rebalance.delay.ms=0
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
log.segment.bytes=67108864
`, controllerPort, dataDir)
}

// prepareKafkaNode writes server.properties (listenerProps followed by the
// common settings) and a log4j2 configuration into dir, and formats the
// storage with a fresh cluster id plus formatArgs (e.g. --add-scram).
func prepareKafkaNode(ctx context.Context, dir, listenerProps string, controllerPort int, maxHeap string, formatArgs ...string) (*kafkaNode, error) {
	java, err := exec.LookPath(envOr("ONCEFLOW_JAVA", "java"))
	if err != nil {
		return nil, errors.New("kafka: java not found: install the Debian package 'openjdk-17-jre-headless' (apt-get install -y openjdk-17-jre-headless)")
	}
	cp, err := kafkaClasspath(ctx)
	if err != nil {
		return nil, err
	}
	n := &kafkaNode{dir: dir, java: java, props: filepath.Join(dir, "server.properties")}
	props := listenerProps + brokerCommonProps(filepath.Join(dir, "data"), controllerPort)
	if err := os.WriteFile(n.props, []byte(props), 0o600); err != nil {
		return nil, err
	}
	log4j := fmt.Sprintf(`status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = %s
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%%d] %%p %%m (%%c)%%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = warn
logger.kafkaorg.name = org.apache.kafka
logger.kafkaorg.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
`, filepath.Join(dir, "server.log"))
	if err := os.WriteFile(filepath.Join(dir, "log4j2.properties"), []byte(log4j), 0o644); err != nil {
		return nil, err
	}
	n.jvm = []string{"-Xms128m", "-Xmx" + maxHeap, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(dir, "log4j2.properties"), "-cp", cp}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	format := append(append([]string{}, n.jvm...), "kafka.tools.StorageTool", "format",
		// "=" form: a base64url id may begin with "-", which the tool's
		// argument parser would take for an option.
		"--cluster-id="+base64.RawURLEncoding.EncodeToString(id), "-c", n.props)
	format = append(format, formatArgs...)
	if out, err := exec.CommandContext(ctx, java, format...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kafka: storage format: %v: %s", err, lastLinesOf(string(out), 5))
	}
	return n, nil
}

// start launches the broker (in its own process group, killed with the
// test process) with stdout and stderr appended to dir/stdout.log; done is
// closed when it exits.
func (n *kafkaNode) start() (cmd *exec.Cmd, done chan struct{}, err error) {
	out, err := os.OpenFile(filepath.Join(n.dir, "stdout.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, nil, err
	}
	defer out.Close()
	cmd = exec.Command(n.java, append(append([]string{}, n.jvm...), "kafka.Kafka", n.props)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("kafka: start: %v", err)
	}
	done = make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	return cmd, done, nil
}
