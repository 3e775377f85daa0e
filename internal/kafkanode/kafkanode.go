// Package kafkanode launches Apache Kafka (KRaft) processes from the jars
// that scripts/services.sh resolves: one node acting as broker and
// controller, prepared in a directory of its own. It is the launcher behind
// the tests' private brokers (internal/testkit) and the soak's three-broker
// cluster (internal/soak); scripts/services.sh starts the shared test broker
// the same way, in shell, from the same templates (broker.properties and
// log4j2.properties in this directory).
package kafkanode

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config describes one node.
type Config struct {
	// Classpath of the Kafka jars (required; see Classpath).
	Classpath string
	// ClusterID is shared by every node of a cluster (default: a random one,
	// right for a single node).
	ClusterID string
	// Dir holds server.properties, log4j2.properties, data/, server.log and
	// stdout.log (required; must exist).
	Dir string
	// FormatArgs are added to the storage format command (e.g. --add-scram).
	FormatArgs []string
	// Listeners are the listener properties: listeners,
	// advertised.listeners, inter.broker.listener.name,
	// listener.security.protocol.map and any per-listener settings (required).
	Listeners string
	// MaxHeap is the JVM's -Xmx (default "384m").
	MaxHeap string
	// NodeID is node.id (default 1).
	NodeID int
	// QuorumVoters is controller.quorum.voters, e.g. "1@127.0.0.1:9093"
	// (required).
	QuorumVoters string
	// ReplicationFactor of the internal topics (__consumer_offsets,
	// __transaction_state) and the default of new topics; from 2 up,
	// min.insync.replicas is 2 for them and the broker default (default 1).
	ReplicationFactor int
}

// Node is a prepared (formatted) node that can be started, killed and
// started again on the same ports and data.
type Node struct {
	Dir   string
	java  string
	props string
	jvm   []string

	// mu guards cmd and done: a supervisor may ask Running while another
	// goroutine restarts the node.
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// current returns the running (or last) process and its exit channel.
func (n *Node) current() (*exec.Cmd, chan struct{}) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd, n.done
}

// The templates of a node's broker and log settings, shared with
// scripts/services.sh (see broker.properties).
var (
	//go:embed broker.properties
	brokerTemplate string
	//go:embed log4j2.properties
	log4jTemplate string
)

// render replaces each ${KEY} of tmpl with vars[KEY], as services.sh's
// render does. A key without a value is a bug of the template.
func render(tmpl string, vars map[string]string) string {
	return os.Expand(tmpl, func(k string) string {
		v, ok := vars[k]
		if !ok {
			panic("kafkanode: template key ${" + k + "} has no value")
		}
		return v
	})
}

// commonProps are the settings every node shares: broker and controller in
// one process, no auto-created topics, no initial rebalance delay.
func commonProps(c Config) string {
	rf := max(c.ReplicationFactor, 1)
	return render(brokerTemplate, map[string]string{
		"NODE_ID":            strconv.Itoa(max(c.NodeID, 1)),
		"QUORUM_VOTERS":      c.QuorumVoters,
		"LOG_DIRS":           filepath.Join(c.Dir, "data"),
		"REPLICATION_FACTOR": strconv.Itoa(rf),
		"MIN_ISR":            strconv.Itoa(min(rf, 2)),
	})
}

// log4jProps are a node's log settings.
func log4jProps(c Config) string {
	return render(log4jTemplate, map[string]string{"LOG_FILE": filepath.Join(c.Dir, "server.log")})
}

// NewClusterID returns a random KRaft cluster id.
func NewClusterID() string {
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	return base64.RawURLEncoding.EncodeToString(id)
}

// Prepare writes the node's configuration into c.Dir and formats its
// storage.
func Prepare(ctx context.Context, c Config) (*Node, error) {
	if c.Dir == "" || c.Listeners == "" || c.QuorumVoters == "" || c.Classpath == "" {
		return nil, errors.New("kafkanode: Dir, Listeners, QuorumVoters and Classpath are required")
	}
	java, err := exec.LookPath(envOr("ONCEFLOW_JAVA", "java"))
	if err != nil {
		return nil, errors.New("kafka: java not found: install the Debian package 'openjdk-17-jre-headless' (apt-get install -y openjdk-17-jre-headless)")
	}
	if c.MaxHeap == "" {
		c.MaxHeap = "384m"
	}
	if c.ClusterID == "" {
		c.ClusterID = NewClusterID()
	}
	n := &Node{Dir: c.Dir, java: java, props: filepath.Join(c.Dir, "server.properties")}
	props := strings.TrimRight(c.Listeners, "\n") + "\n" + commonProps(c)
	if err := os.WriteFile(n.props, []byte(props), 0o600); err != nil {
		return nil, err
	}
	log4j := log4jProps(c)
	if err := os.WriteFile(filepath.Join(c.Dir, "log4j2.properties"), []byte(log4j), 0o644); err != nil {
		return nil, err
	}
	n.jvm = []string{"-Xms128m", "-Xmx" + c.MaxHeap, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(c.Dir, "log4j2.properties"), "-cp", c.Classpath}
	format := append(append([]string{}, n.jvm...), "kafka.tools.StorageTool", "format",
		// "=" form: a base64url id may begin with "-", which the tool's
		// argument parser would take for an option.
		"--cluster-id="+c.ClusterID, "-c", n.props)
	format = append(format, c.FormatArgs...)
	if out, err := exec.CommandContext(ctx, java, format...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kafka: storage format: %v: %s", err, LastLines(string(out), 5))
	}
	return n, nil
}

// Start launches the node (in its own process group, killed when the
// starting thread's process dies) with stdout and stderr appended to
// Dir/stdout.log. It fails if the node runs already.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if alive(n.done) {
		return errors.New("kafka: node already running")
	}
	out, err := os.OpenFile(filepath.Join(n.Dir, "stdout.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(n.java, append(append([]string{}, n.jvm...), "kafka.Kafka", n.props)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kafka: start: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	n.cmd, n.done = cmd, done
	return nil
}

// Running reports whether the node's process is alive.
func (n *Node) Running() bool {
	_, done := n.current()
	return alive(done)
}

// alive reports whether done (a process's exit channel) is still open.
func alive(done chan struct{}) bool {
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Done is closed when the current process exits (nil before Start).
func (n *Node) Done() <-chan struct{} {
	_, done := n.current()
	return done
}

// PID of the current process (0 before Start).
func (n *Node) PID() int {
	cmd, _ := n.current()
	if cmd == nil || cmd.Process == nil {
		return 0
	}
	return cmd.Process.Pid
}

// Kill sends SIGKILL to the node's process group (a hard crash) and waits
// for the process to be gone.
func (n *Node) Kill() {
	n.signalWait(syscall.SIGKILL, nil)
}

// Terminate sends SIGTERM (a controlled shutdown) and waits for the exit or
// for ctx to end.
func (n *Node) Terminate(ctx context.Context) error {
	return n.signalWait(syscall.SIGTERM, ctx.Done())
}

func (n *Node) signalWait(sig syscall.Signal, cancel <-chan struct{}) error {
	cmd, done := n.current()
	if !alive(done) {
		return nil
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-done:
		return nil
	case <-cancel:
		return errors.New("kafka: node did not stop in time")
	}
}

// ErrExitedDuringStart is WaitReady's error when the node's process ended
// before it answered.
var ErrExitedDuringStart = errors.New("kafka exited during start")

// WaitReady calls ping (a metadata request by the caller's client) every
// 200ms until it succeeds, the process exits or ctx ends.
func (n *Node) WaitReady(ctx context.Context, ping func(context.Context) error) error {
	_, done := n.current()
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = ping(pctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%w: see %s", ErrExitedDuringStart, n.LogHint())
		case <-ctx.Done():
			return fmt.Errorf("kafka did not answer (%v): see %s", last, n.LogHint())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// LogHint names the node's log files and quotes the end of each.
func (n *Node) LogHint() string {
	b, _ := os.ReadFile(filepath.Join(n.Dir, "server.log"))
	o, _ := os.ReadFile(filepath.Join(n.Dir, "stdout.log"))
	return fmt.Sprintf("%s/server.log:\n%s\nstdout.log:\n%s", n.Dir, LastLines(string(b), 10), LastLines(string(o), 10))
}

// Classpath asks scripts/services.sh (at script) for the cached Kafka jars,
// resolving them with mvn on the first run.
func Classpath(ctx context.Context, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", script, "classpath")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("kafka: %s classpath: %v: %s", script, err, strings.TrimSpace(stderr.String()))
	}
	cp := strings.TrimSpace(string(out))
	if cp == "" {
		return "", fmt.Errorf("kafka: %s classpath printed nothing", script)
	}
	return cp, nil
}

// FreePorts returns n distinct loopback ports that were free a moment ago.
func FreePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// LastLines is the last n lines of s.
func LastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
