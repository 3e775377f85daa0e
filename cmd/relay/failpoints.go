package main

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/failpoint"
	"github.com/onceflow/onceflow/pkg/relay"
)

// relayHooks installs the fault tests' failpoints (armed through
// ONCEFLOW_FAILPOINTS; see internal/failpoint) as the relay's hooks. Unarmed,
// each costs an atomic load.
func relayHooks() relay.Hooks {
	return relay.Hooks{
		CheckpointReaderOpts: slowCheckpointOpts,
		OnAfterKafkaCommit:   failpoint.Func(failpoint.RelayAfterKafkaCommit),
		OnBeforeKafkaCommit:  failpoint.Func(failpoint.RelayBeforeKafkaCommit),
	}
}

// slowCheckpointOpts, with failpoint.RelaySlowCheckpoint armed, gives the
// checkpoint reader a dialer that holds every Fetch response written from
// the reader's first Fetch on until the armed delay is up.
func slowCheckpointOpts() []kgo.Opt {
	d := failpoint.Delay(failpoint.RelaySlowCheckpoint)
	if d <= 0 {
		return nil
	}
	return []kgo.Opt{kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, host)
		if err != nil {
			return c, err
		}
		return &slowConn{Conn: c, d: d}, nil
	})}
}

var slowCheckpoint struct {
	sync.Mutex
	until time.Time // zero until the first Fetch
}

// slowConn holds the response to a Fetch request written in the slow
// period until the period ends.
type slowConn struct {
	net.Conn
	d     time.Duration
	until atomic.Int64 // unix nanos; 0: the last request was no slow Fetch
}

func (c *slowConn) Write(b []byte) (int, error) {
	// A request is a 4-byte length, then the API key (Fetch = 1).
	if len(b) >= 6 && binary.BigEndian.Uint16(b[4:6]) == 1 {
		slowCheckpoint.Lock()
		if slowCheckpoint.until.IsZero() {
			slowCheckpoint.until = time.Now().Add(c.d)
		}
		until := slowCheckpoint.until
		slowCheckpoint.Unlock()
		c.until.Store(until.UnixNano())
	}
	return c.Conn.Write(b)
}

func (c *slowConn) Read(b []byte) (int, error) {
	if u := c.until.Swap(0); u != 0 {
		if d := time.Until(time.Unix(0, u)); d > 0 {
			time.Sleep(d) // the injected slowness itself
		}
	}
	return c.Conn.Read(b)
}
