package testkit

import (
	"context"
	"fmt"

	"github.com/onceflow/onceflow/internal/kafkanode"
)

// prepareKafkaNode prepares a single-node KRaft broker in dir (see
// internal/kafkanode): listenerProps followed by the common settings,
// formatted with a fresh cluster id plus formatArgs (e.g. --add-scram).
func prepareKafkaNode(ctx context.Context, dir, listenerProps string, controllerPort int, maxHeap string, formatArgs ...string) (*kafkanode.Node, error) {
	cp, err := kafkaClasspath(ctx)
	if err != nil {
		return nil, err
	}
	return kafkanode.Prepare(ctx, kafkanode.Config{
		Classpath:    cp,
		Dir:          dir,
		FormatArgs:   formatArgs,
		Listeners:    listenerProps,
		MaxHeap:      maxHeap,
		QuorumVoters: fmt.Sprintf("1@127.0.0.1:%d", controllerPort),
	})
}
