package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/relay"
)

// cutter is a dialer whose connections it can cut: while cut, every open
// connection is closed and new ones are refused.
type cutter struct {
	cut   atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
}

func (c *cutter) dial(ctx context.Context, network, host string) (net.Conn, error) {
	if c.cut.Load() {
		return nil, errors.New("cut by the test")
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err == nil {
		c.mu.Lock()
		c.conns = append(c.conns, conn)
		c.mu.Unlock()
	}
	return conn, err
}

func (c *cutter) set(cut bool) {
	c.cut.Store(cut)
	if !cut {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = nil
}

var settledAborted = regexp.MustCompile(`"outcome":"0 rows committed, [1-6] aborted, checkpoint aborted"`)

// A commit that gets no answer leaves its batch in doubt; the next
// recovery settles it by its records (here: aborted in every partition, as
// the commit never reached the coordinator) and the batch is published
// again, once. The relay's connections to Kafka are cut right before its
// first commit and healed 6 s later.
func TestRelaySettlesAnUnknownCommitByItsRecords(t *testing.T) {
	t.Parallel()
	topic := testkit.Topic(t, "unit-indoubt", 2, nil)
	cut := &cutter{}
	var once sync.Once
	rb := startRelay(t, topic, func(c *relay.Config) {
		c.KafkaOpts = append(c.KafkaOpts, kgo.Dialer(cut.dial))
		c.TransactionTimeout = 4 * time.Second
		c.Hooks.OnBeforeKafkaCommit = func() {
			once.Do(func() {
				cut.set(true)
				time.AfterFunc(6*time.Second, func() { cut.set(false) })
			})
		}
	})
	const n = 6
	for i := range n {
		m := outbox.Message{Topic: topic, Source: fmt.Sprintf("s-%d", i%2), EventType: "x", Payload: []byte(`1`), EventID: fmt.Sprintf("ev-%d", i)}
		if _, err := rb.enqueue(t, outbox.Writer{}, m); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the batch in doubt settled", func() bool {
		return strings.Contains(rb.logs.String(), "batch in doubt settled by its records")
	})
	cons := testkit.ReadCommittedClient(t, topic)
	seen := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	for total := 0; total < n; {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("saw %v; relay logs:\n%s", seen, rb.logs)
		}
		fs.EachRecord(func(r *kgo.Record) {
			env, err := envelope.Decode(r, 0)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			seen[env.EventID]++
			total++
		})
	}
	// Anything published twice would be on the topic by the time the rows
	// are all marked: wait for that, then read what is left.
	waitUntil(t, "every row marked", func() bool {
		var pending int
		if err := rb.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM onceflow.outbox_pending`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return pending == 0
	})
	end, cancelEnd := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelEnd()
	cons.PollFetches(end).EachRecord(func(r *kgo.Record) {
		if env, err := envelope.Decode(r, 0); err == nil {
			seen[env.EventID]++
		}
	})
	for i := range n {
		if id := fmt.Sprintf("ev-%d", i); seen[id] != 1 {
			t.Errorf("%s on the topic %d times, want 1", id, seen[id])
		}
	}
	if v := testutil.ToFloat64(metricLabel(t, rb.reg, "onceflow_relay_errors_total", "unknown_outcome")); v < 1 {
		t.Errorf("unknown outcomes counted: %v, want at least 1", v)
	}
	// The first batch holds the rows enqueued before the relay's first poll:
	// all six, or fewer when it polled between two enqueues.
	if !settledAborted.MatchString(rb.logs.String()) {
		t.Errorf("the batch was not settled as aborted everywhere; relay logs:\n%s", rb.logs)
	}
}
