package kafkanode

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// A single node keeps replication factor 1 everywhere; a three-node
// cluster gets 3 with min.insync.replicas 2 for the internal topics and as
// the broker default.
func TestCommonProps(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  Config
		want []string
	}{
		{Config{Dir: "/d", QuorumVoters: "1@127.0.0.1:9"}, []string{
			"node.id=1\n", "controller.quorum.voters=1@127.0.0.1:9\n", "log.dirs=/d/data\n",
			"offsets.topic.replication.factor=1\n", "transaction.state.log.min.isr=1\n", "min.insync.replicas=1\n",
		}},
		{Config{Dir: "/d", NodeID: 2, QuorumVoters: "1@a:1,2@a:2,3@a:3", ReplicationFactor: 3}, []string{
			"node.id=2\n", "default.replication.factor=3\n", "offsets.topic.replication.factor=3\n",
			"transaction.state.log.replication.factor=3\n", "transaction.state.log.min.isr=2\n", "min.insync.replicas=2\n",
			"unclean.leader.election.enable=false\n",
		}},
	} {
		got := commonProps(c.cfg)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%+v: properties lack %q:\n%s", c.cfg, w, got)
			}
		}
	}
}

// A supervisor may ask Running, Done and PID while another goroutine kills
// and restarts the node (the soak does both); under -race this fails if the
// node's process fields are read without its lock.
func TestNodeConcurrentRestartAndRunning(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fake := filepath.Join(dir, "java")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nexec sleep 30\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	n := &Node{Dir: dir, java: fake, props: filepath.Join(dir, "server.properties")}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	defer n.Kill()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = n.Running()
			_ = n.PID()
			_ = n.Done()
		}
	}()
	for range 5 {
		n.Kill()
		if n.Running() {
			t.Fatal("Running after Kill")
		}
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		if !n.Running() {
			t.Fatal("not Running after Start")
		}
		if err := n.Start(); err == nil {
			t.Fatal("a second Start of a running node succeeded")
		}
	}
	close(stop)
	wg.Wait()
}

// The shared test broker of scripts/services.sh and the Go launcher's nodes
// are configured from one template: the script's rendering of a single node
// is byte for byte what this package writes for the same node, listener
// lines aside (each caller's own). It fails when either stops reading the
// templates or adds a setting of its own.
func TestServicesScriptUsesTheTemplates(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash not found: %v", err)
	}
	run := t.TempDir()
	cmd := exec.Command(bash, filepath.Join("..", "..", "scripts", "services.sh"), "kafka-config", "59092", "59192")
	cmd.Env = append(os.Environ(), "ONCEFLOW_RUN_DIR="+run)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("services.sh kafka-config: %v\n%s", err, out)
	}
	c := Config{Dir: filepath.Join(run, "kafka"), QuorumVoters: "1@127.0.0.1:59192"}
	listeners := "listeners=PLAINTEXT://127.0.0.1:59092,CONTROLLER://127.0.0.1:59192\n" +
		"advertised.listeners=PLAINTEXT://127.0.0.1:59092\n" +
		"inter.broker.listener.name=PLAINTEXT\n" +
		"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
	for file, want := range map[string]string{
		"server.properties": listeners + commonProps(c),
		"log4j2.properties": log4jProps(c),
	} {
		got, err := os.ReadFile(filepath.Join(c.Dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("services.sh's %s differs from kafkanode's:\n--- services.sh\n%s\n--- kafkanode\n%s", file, got, want)
		}
	}
	if strings.Contains(commonProps(c), "${") || strings.Contains(log4jProps(c), "${") {
		t.Error("a placeholder is left in the Go rendering")
	}
}
