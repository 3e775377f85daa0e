// Package tcpproxy is a loopback TCP proxy for fault tests: clients connect
// to the proxy instead of the server, and the test cuts their connections
// (both directions reset, new ones refused for a while), stalls them (no
// byte forwarded either way, as in a network partition, until it heals) or
// slows them (every chunk held for a latency, as with a slow server).
package tcpproxy

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards each accepted connection to Target.
type Proxy struct {
	// Target is the server's address, host:port (guarded by mu once the
	// proxy runs: see Retarget).
	Target string

	ln net.Listener

	mu       sync.Mutex
	conns    map[*pair]struct{}
	cutUntil time.Time
	// gate is closed while traffic flows; a stall replaces it with an open
	// channel that is closed when the stall ends.
	gate      chan struct{}
	stallStop *time.Timer
	// latency is added to every chunk until slowUntil.
	latency   time.Duration
	slowUntil time.Time
	closed    bool

	accepted, refused, reset atomic.Int64
	wg                       sync.WaitGroup
}

type pair struct {
	client, server net.Conn
}

// Listen starts a proxy on addr (e.g. "127.0.0.1:0") forwarding to target.
func Listen(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	gate := make(chan struct{})
	close(gate)
	p := &Proxy{Target: target, ln: ln, conns: map[*pair]struct{}{}, gate: gate}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's listening port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Stats counts connections accepted and forwarded, refused during a cut,
// and reset by a cut.
type Stats struct {
	Accepted, Refused, Reset int64
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{Accepted: p.accepted.Load(), Refused: p.refused.Load(), Reset: p.reset.Load()}
}

// Cut resets every open connection in both directions and refuses new
// connections (accepted, then reset at once) for d.
func (p *Proxy) Cut(d time.Duration) {
	p.mu.Lock()
	p.cutUntil = time.Now().Add(d)
	victims := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		victims = append(victims, c)
	}
	p.mu.Unlock()
	for _, c := range victims {
		c.abort()
		p.reset.Add(1)
	}
}

// Stall stops forwarding bytes in both directions for d: connections stay
// open and new ones are accepted, but nothing passes until the stall ends,
// as when the network between client and server drops every packet.
func (p *Proxy) Stall(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already stalled: extend
		p.stallStop.Stop()
	}
	gate := p.gate
	p.stallStop = time.AfterFunc(d, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		select {
		case <-gate: // healed meanwhile
		default:
			close(gate)
		}
	})
}

// Slow holds every chunk, in both directions, for latency before passing
// it on, for d: requests and answers arrive, late.
func (p *Proxy) Slow(latency, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency, p.slowUntil = latency, time.Now().Add(d)
}

// Retarget forwards new connections to target from now on and resets the
// open ones (their server is the old target), as a switchover repoints a
// virtual address.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	p.Target = target
	victims := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		victims = append(victims, c)
	}
	p.mu.Unlock()
	for _, c := range victims {
		c.abort()
		p.reset.Add(1)
	}
}

// Heal ends a cut, a stall or a slowdown now.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutUntil = time.Time{}
	p.slowUntil = time.Time{}
	select {
	case <-p.gate:
	default:
		p.stallStop.Stop()
		close(p.gate)
	}
}

// Close stops listening and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	victims := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		victims = append(victims, c)
	}
	p.mu.Unlock()
	p.Heal()
	err := p.ln.Close()
	for _, c := range victims {
		c.abort()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: let it pass
			continue
		}
		p.mu.Lock()
		cut := time.Now().Before(p.cutUntil) || p.closed
		p.mu.Unlock()
		if cut {
			resetConn(c)
			p.refused.Add(1)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	target := p.Target
	p.mu.Unlock()
	server, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		resetConn(client)
		p.refused.Add(1)
		return
	}
	c := &pair{client: client, server: server}
	p.mu.Lock()
	if p.closed || time.Now().Before(p.cutUntil) {
		p.mu.Unlock()
		c.abort()
		p.refused.Add(1)
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	p.accepted.Add(1)
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		if !p.pipe(dst, src) {
			c.abort()
		}
	}
	go pipe(server, client)
	go pipe(client, server)
	wg.Wait()
	client.Close()
	server.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pipe copies src to dst, holding each chunk while the proxy is stalled. It
// reports whether src ended cleanly (EOF, passed on as a half-close).
func (p *Proxy) pipe(dst, src net.Conn) bool {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			var delay time.Duration
			if time.Now().Before(p.slowUntil) {
				delay = p.latency
			}
			p.mu.Unlock()
			if delay > 0 {
				time.Sleep(delay) // the injected latency
			}
			<-gate
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return false
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				return true
			}
			return false
		}
	}
}

// abort closes both sides with a reset (no lingering FIN handshake).
func (c *pair) abort() {
	resetConn(c.client)
	resetConn(c.server)
}

func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// String is "addr -> target".
func (p *Proxy) String() string {
	p.mu.Lock()
	target := p.Target
	p.mu.Unlock()
	return p.Addr() + " -> " + target + " (accepted " + strconv.FormatInt(p.accepted.Load(), 10) + ")"
}
