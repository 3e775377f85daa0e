package soak

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/onceflow/onceflow/internal/kafkanode"
	"github.com/onceflow/onceflow/internal/tcpproxy"
)

// broker is one node of the soak's cluster. Clients of the binaries reach
// it through proxy (its advertised EXTERNAL listener); the other brokers
// reach it through repl (its REPLICATION listener, the inter-broker one)
// and each through a proxy of its own to its CONTROLLER listener
// (ctrlFrom[peer]: the address that peer's controller.quorum.voters names
// for it), so that a partition cuts what reaches it from its peers, and a
// controller partition its controller paths both ways; the soak's own
// clients use the INTERNAL listener, which no fault touches.
type broker struct {
	id       int32
	node     *kafkanode.Node
	internal string // 127.0.0.1:port of the INTERNAL listener
	proxy    *tcpproxy.Proxy
	repl     *tcpproxy.Proxy
	// ctrlFrom[j] carries node j's connections to this node's controller
	// (nil without peer proxies; a node reaches its own directly).
	ctrlFrom map[int32]*tcpproxy.Proxy
	// disk is the mount point of the node's data directory when it is a
	// tmpfs of its own (the broker whose disk fills), else "".
	disk string
}

// cluster is a three-node KRaft cluster (each node broker and controller)
// started for one soak, with replication factor 3 and min.insync.replicas 2
// for the internal topics, as in production.
type cluster struct {
	brokers []*broker
	mu      sync.Mutex // guards node start/kill
}

const clusterSize = 3

// startCluster starts the three nodes in dir. When a node does not come
// up, the cluster is returned with the error, to be stopped by the caller. With diskSize > 0 the last
// node's data directory is a tmpfs of that size (for the disk-full fault);
// when it cannot be mounted (not root, no tmpfs), diskErr says why and the
// node uses dir like the others.
//
// With peers, the brokers reach each other's REPLICATION and CONTROLLER
// listeners through proxies (for the partition fault); without, directly:
// the proxies cost CPU in the soak's process on every replica fetch and
// every quorum request, which a race-instrumented test pays dearly for.
func startCluster(ctx context.Context, script, dir string, diskSize int64, peers bool) (c *cluster, diskErr error, err error) {
	cp, err := kafkanode.Classpath(ctx, script)
	if err != nil {
		return nil, nil, err
	}
	const perNode = 4 // external, internal, controller, replication
	// The proxies' ports come from the same pool as the brokers': a proxy
	// listening on port 0 could be handed a port FreePorts just chose for a
	// broker and released, and the broker then failed to bind it ("Address
	// already in use", seen in CI). Per node: its client proxy, its
	// replication proxy and one controller proxy per other node.
	const proxiesPerNode = 2 + clusterSize - 1
	ports, err := kafkanode.FreePorts((perNode + proxiesPerNode) * clusterSize)
	if err != nil {
		return nil, nil, err
	}
	proxyPorts := ports[perNode*clusterSize:]
	proxyAddr := func() string {
		a := fmt.Sprintf("127.0.0.1:%d", proxyPorts[0])
		proxyPorts = proxyPorts[1:]
		return a
	}
	c = &cluster{}
	// Every node has its proxies first: the voters name the controller
	// proxies.
	for i := range clusterSize {
		b := &broker{id: int32(i + 1), internal: fmt.Sprintf("127.0.0.1:%d", ports[perNode*i+1])}
		c.brokers = append(c.brokers, b)
		for _, x := range []struct {
			px   **tcpproxy.Proxy
			port int
			want bool
		}{{&b.proxy, ports[perNode*i], true}, {&b.repl, ports[perNode*i+3], peers}} {
			if !x.want {
				continue
			}
			if *x.px, err = tcpproxy.Listen(proxyAddr(), fmt.Sprintf("127.0.0.1:%d", x.port)); err != nil {
				c.stop()
				return nil, nil, err
			}
		}
		if !peers {
			continue
		}
		b.ctrlFrom = map[int32]*tcpproxy.Proxy{}
		for j := range clusterSize {
			if j == i {
				continue
			}
			px, err := tcpproxy.Listen(proxyAddr(), fmt.Sprintf("127.0.0.1:%d", ports[perNode*i+2]))
			if err != nil {
				c.stop()
				return nil, nil, err
			}
			b.ctrlFrom[int32(j+1)] = px
		}
	}
	// Each node's voters: its own controller directly, the others' through
	// the proxies that carry its connections to them.
	votersOf := func(self int32) string {
		var voters []string
		for i, b := range c.brokers {
			port := ports[perNode*i+2]
			if px := b.ctrlFrom[self]; px != nil {
				port = px.Port()
			}
			voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", b.id, port))
		}
		return strings.Join(voters, ",")
	}
	clusterID := kafkanode.NewClusterID()
	cfgs := make([]kafkanode.Config, clusterSize)
	for i, b := range c.brokers {
		external, internal, controller, replication := ports[perNode*i], ports[perNode*i+1], ports[perNode*i+2], ports[perNode*i+3]
		advertisedRepl := replication
		if b.repl != nil {
			advertisedRepl = b.repl.Port()
		}
		bdir := filepath.Join(dir, fmt.Sprintf("broker-%d", i+1))
		if err := os.MkdirAll(filepath.Join(bdir, "data"), 0o755); err != nil {
			c.stop()
			return nil, nil, err
		}
		if diskSize > 0 && i == clusterSize-1 {
			if diskErr = mountTmpfs(ctx, filepath.Join(bdir, "data"), diskSize); diskErr == nil {
				b.disk = filepath.Join(bdir, "data")
			}
		}
		listeners := fmt.Sprintf(`listeners=EXTERNAL://127.0.0.1:%d,INTERNAL://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d,REPLICATION://127.0.0.1:%d
advertised.listeners=EXTERNAL://127.0.0.1:%d,INTERNAL://127.0.0.1:%d,REPLICATION://127.0.0.1:%d
inter.broker.listener.name=REPLICATION
listener.security.protocol.map=EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT,REPLICATION:PLAINTEXT
`, external, internal, controller, replication, b.proxy.Port(), internal, advertisedRepl)
		cfgs[i] = kafkanode.Config{
			Classpath: cp, ClusterID: clusterID, Dir: bdir, Listeners: listeners, MaxHeap: "384m",
			NodeID: i + 1, QuorumVoters: votersOf(b.id), ReplicationFactor: clusterSize,
		}
	}
	// Formatting a node's storage starts a JVM: the three at once.
	errs := make([]error, clusterSize)
	var wg sync.WaitGroup
	for i, b := range c.brokers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b.node, errs[i] = kafkanode.Prepare(ctx, cfgs[i]); errs[i] != nil {
				errs[i] = fmt.Errorf("broker %d: %w", i+1, errs[i])
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.stop()
		return nil, nil, err
	}
	for _, b := range c.brokers {
		if err := b.node.Start(); err != nil {
			c.stop()
			return nil, nil, fmt.Errorf("broker %d: %w", b.id, err)
		}
	}
	for _, b := range c.brokers {
		if err := c.waitBroker(ctx, b); err != nil {
			// Returned with the error: the caller keeps the brokers' logs,
			// then stops them.
			return c, nil, err
		}
	}
	return c, diskErr, nil
}

// diskBroker is the broker whose data directory is a tmpfs of its own, or
// nil.
func (c *cluster) diskBroker() *broker {
	for _, b := range c.brokers {
		if b.disk != "" {
			return b
		}
	}
	return nil
}

// externalSeeds are the proxy addresses the binaries are given.
func (c *cluster) externalSeeds() []string {
	var s []string
	for _, b := range c.brokers {
		s = append(s, b.proxy.Addr())
	}
	return s
}

// internalOpts connect the soak's own clients past the proxies.
func (c *cluster) internalOpts() []kgo.Opt {
	var s []string
	for _, b := range c.brokers {
		s = append(s, b.internal)
	}
	return []kgo.Opt{kgo.SeedBrokers(s...), kgo.RetryTimeout(30 * time.Second)}
}

func (c *cluster) broker(id int32) *broker {
	for _, b := range c.brokers {
		if b.id == id {
			return b
		}
	}
	return nil
}

// waitBroker waits until b answers a metadata request on its own INTERNAL
// listener and the cluster lists it.
func (c *cluster) waitBroker(ctx context.Context, b *broker) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.internal))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := b.node.WaitReady(ctx, func(ctx context.Context) error {
		m, err := adm.BrokerMetadata(ctx)
		if err != nil {
			return err
		}
		for _, bd := range m.Brokers {
			if bd.NodeID == b.id {
				return nil
			}
		}
		return fmt.Errorf("broker %d not registered yet", b.id)
	}); err != nil {
		return fmt.Errorf("broker %d: %w", b.id, err)
	}
	return nil
}

// kill SIGKILLs broker id (a hard crash: no controlled shutdown).
func (c *cluster) kill(id int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b := c.broker(id); b != nil {
		b.node.Kill()
	}
}

// restart starts broker id again and waits until it answers.
func (c *cluster) restart(ctx context.Context, id int32) error {
	b := c.broker(id)
	c.mu.Lock()
	err := b.node.Start()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.waitBroker(ctx, b)
}

// ensureRunning starts any broker that is not running (e.g. one that
// crashed by itself) and reports which.
func (c *cluster) ensureRunning(ctx context.Context) ([]int32, error) {
	var started []int32
	for _, b := range c.brokers {
		if b.node.Running() {
			continue
		}
		if err := c.restart(ctx, b.id); err != nil {
			return started, err
		}
		started = append(started, b.id)
	}
	return started, nil
}

// healthy reports whether every partition of every topic (internal ones
// included) has all its replicas in sync; else a description of the first
// that does not.
func healthy(ctx context.Context, adm *kadm.Client) (bool, string, error) {
	m, err := adm.Metadata(ctx)
	if err != nil {
		return false, "", err
	}
	if len(m.Brokers) < clusterSize {
		return false, fmt.Sprintf("%d of %d brokers registered", len(m.Brokers), clusterSize), nil
	}
	for _, t := range m.Topics.Sorted() {
		if t.Err != nil {
			return false, fmt.Sprintf("topic %s: %v", t.Topic, t.Err), nil
		}
		for _, p := range t.Partitions.Sorted() {
			if p.Err != nil || p.Leader < 0 || len(p.ISR) < len(p.Replicas) {
				return false, fmt.Sprintf("%s/%d: leader %d, isr %v of %v", t.Topic, p.Partition, p.Leader, p.ISR, p.Replicas), nil
			}
		}
	}
	return true, "", nil
}

// waitHealthy polls healthy until it holds or limit passes.
func waitHealthy(ctx context.Context, adm *kadm.Client, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ok, why, err := healthy(qctx, adm)
		cancel()
		if ok {
			return "", nil
		}
		if err != nil {
			why = err.Error()
		}
		if time.Now().After(deadline) {
			return why, nil
		}
		select {
		case <-ctx.Done():
			return why, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Broker roles a broker fault targets.
const (
	roleEventLeader      = "event-partition-leader"
	roleCheckpointLeader = "checkpoint-leader"
	roleTxnCoordinator   = "txn-coordinator"
	roleGroupCoordinator = "group-coordinator"
)

var brokerRoles = []string{roleEventLeader, roleCheckpointLeader, roleTxnCoordinator, roleGroupCoordinator}

// roleHolder finds the broker that currently plays role: the leader of
// event partition pick (modulo the partition count), of the checkpoint
// partition, the coordinator of the relay's transactional id, or of the
// consumer group.
func roleHolder(ctx context.Context, adm *kadm.Client, role string, pick int, eventTopic, ckptTopic, group string) (int32, string, error) {
	switch role {
	case roleEventLeader, roleCheckpointLeader:
		topic := eventTopic
		if role == roleCheckpointLeader {
			topic = ckptTopic
		}
		m, err := adm.Metadata(ctx, topic)
		if err != nil {
			return -1, "", err
		}
		t, ok := m.Topics[topic]
		if !ok || t.Err != nil || len(t.Partitions) == 0 {
			return -1, "", fmt.Errorf("metadata of %s: %v", topic, t.Err)
		}
		ps := t.Partitions.Sorted()
		p := ps[pick%len(ps)]
		if p.Leader < 0 {
			return -1, "", fmt.Errorf("%s/%d has no leader", topic, p.Partition)
		}
		return p.Leader, fmt.Sprintf("leader of %s/%d", topic, p.Partition), nil
	case roleTxnCoordinator:
		txns, err := adm.ListTransactions(ctx, nil, nil)
		if err != nil && len(txns) == 0 {
			return -1, "", fmt.Errorf("list transactions: %w", err)
		}
		ids := make([]string, 0, len(txns))
		for id := range txns {
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			return -1, "", errors.New("no transactional id on the cluster yet")
		}
		sort.Strings(ids)
		id := ids[pick%len(ids)]
		return txns[id].Coordinator, "coordinator of transactional id " + id, nil
	case roleGroupCoordinator:
		r := adm.FindGroupCoordinators(ctx, group)[group]
		if r.Err != nil {
			return -1, "", fmt.Errorf("find coordinator of group %s: %w", group, r.Err)
		}
		return r.NodeID, "coordinator of group " + group, nil
	}
	return -1, "", fmt.Errorf("unknown broker role %q", role)
}

// stop kills every broker, closes the proxies and unmounts a tmpfs.
func (c *cluster) stop() {
	for _, b := range c.brokers {
		if b.node != nil {
			b.node.Kill()
		}
		for _, px := range []*tcpproxy.Proxy{b.proxy, b.repl} {
			if px != nil {
				_ = px.Close()
			}
		}
		for _, px := range b.ctrlFrom {
			_ = px.Close()
		}
		if b.disk != "" {
			_ = unmount(b.disk)
		}
	}
}

// healPeers ends a partition of b.
func (b *broker) healPeers() {
	if b.repl != nil {
		b.repl.Heal()
	}
	for _, px := range b.ctrlFrom {
		px.Heal()
	}
}

// cutFromPeers cuts what reaches b from its peers for d: replication and
// its controller.
func (b *broker) cutFromPeers(d time.Duration) {
	b.repl.Cut(d)
	for _, px := range b.ctrlFrom {
		px.Cut(d)
	}
}

// cutController cuts b's controller paths both ways for d: the peers'
// connections to b's controller, and b's connections to theirs (its
// controller's votes and fetches, its broker's heartbeats and metadata).
// Replication and clients pass.
func (c *cluster) cutController(b *broker, d time.Duration) {
	for _, px := range b.ctrlFrom {
		px.Cut(d)
	}
	for _, o := range c.brokers {
		if px := o.ctrlFrom[b.id]; px != nil {
			px.Cut(d)
		}
	}
}

// healController ends cutController(b).
func (c *cluster) healController(b *broker) {
	for _, px := range b.ctrlFrom {
		px.Heal()
	}
	for _, o := range c.brokers {
		if px := o.ctrlFrom[b.id]; px != nil {
			px.Heal()
		}
	}
}

// waitTopics waits until every broker's own metadata lists every topic
// with a leader for each partition: a topic just created reaches the
// brokers one after another, and a binary started meanwhile may ask one that
// does not know it yet.
func (c *cluster) waitTopics(ctx context.Context, topics ...string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(c.internalOpts()...)
	if err != nil {
		return err
	}
	defer cl.Close()
	for _, b := range c.brokers {
		for {
			why := knows(ctx, cl.Broker(int(b.id)), topics)
			if why == "" {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("topics not visible on every broker: broker %d: %s", b.id, why)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// knows asks one broker for the topics' metadata: "" when it lists them
// all with a leader for every partition, else what is missing.
func knows(ctx context.Context, b *kgo.Broker, topics []string) string {
	req := kmsg.NewPtrMetadataRequest()
	for _, name := range topics {
		t := kmsg.NewMetadataRequestTopic()
		t.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, t)
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(qctx, b)
	if err != nil {
		return err.Error()
	}
	if len(resp.Topics) != len(topics) {
		return fmt.Sprintf("%d of %d topics listed", len(resp.Topics), len(topics))
	}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil || len(t.Partitions) == 0 {
			return fmt.Sprintf("topic %s: %v", deref(t.Topic), err)
		}
		for _, p := range t.Partitions {
			if p.Leader < 0 || p.ErrorCode != 0 {
				return fmt.Sprintf("%s/%d has no leader yet", deref(t.Topic), p.Partition)
			}
		}
	}
	return ""
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// activeController asks the quorum (DescribeQuorum, forwarded by a broker)
// which node is the active controller.
func activeController(ctx context.Context, cl *kgo.Client) (int32, error) {
	req := kmsg.NewPtrDescribeQuorumRequest()
	t := kmsg.NewDescribeQuorumRequestTopic()
	t.Topic = "__cluster_metadata"
	p := kmsg.NewDescribeQuorumRequestTopicPartition()
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(qctx, cl)
	if err != nil {
		return -1, err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return -1, err
	}
	if len(resp.Topics) == 0 || len(resp.Topics[0].Partitions) == 0 {
		return -1, errors.New("describe quorum: no partition in the answer")
	}
	qp := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(qp.ErrorCode); err != nil {
		return -1, err
	}
	return qp.LeaderID, nil
}
