package kafkanode

import (
	"strings"
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
