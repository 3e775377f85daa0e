package testkit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/kafkanode"
)

// PrivateKafka is a single-node PLAINTEXT Kafka (KRaft) owned by one test,
// for fault tests that stop or restart the broker without disturbing the
// shared one. It keeps its ports and data across Restart.
type PrivateKafka struct {
	// Brokers is the client listener, 127.0.0.1:port.
	Brokers string
	Dir     string

	node *kafkanode.Node
}

// StartPrivateKafka formats and starts a broker and stops it on cleanup.
func StartPrivateKafka(t testing.TB) *PrivateKafka {
	t.Helper()
	SkipIfShort(t, "a private Kafka broker")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ports, err := kafkanode.FreePorts(2)
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
	t.Cleanup(k.node.Kill)
	if err := k.start(ctx); err != nil {
		t.Fatal(err)
	}
	return k
}

func (k *PrivateKafka) start(ctx context.Context) error {
	if err := k.node.Start(); err != nil {
		return fmt.Errorf("private kafka: %w", err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers))
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := k.node.WaitReady(ctx, cl.Ping); err != nil {
		return fmt.Errorf("private kafka: %w", err)
	}
	return nil
}

// Restart stops the broker (SIGTERM, a controlled shutdown) and starts it
// again on the same ports and data.
func (k *PrivateKafka) Restart(ctx context.Context) error {
	if err := k.node.Terminate(ctx); err != nil {
		return err
	}
	return k.start(ctx)
}
