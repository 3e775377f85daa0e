package tcpproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers each line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func setup(t *testing.T) *Proxy {
	t.Helper()
	p, err := Listen("127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func roundTrip(c net.Conn, r *bufio.Reader, msg string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	return line, err
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func TestForwards(t *testing.T) {
	p := setup(t)
	c, r := dial(t, p)
	if got, err := roundTrip(c, r, "hello", 5*time.Second); err != nil || got != "hello\n" {
		t.Fatalf("round trip: %q %v", got, err)
	}
	if s := p.Stats(); s.Accepted != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A cut resets the open connection and refuses new ones until it ends.
func TestCut(t *testing.T) {
	p := setup(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut(time.Hour)
	if _, err := roundTrip(c, r, "during", 5*time.Second); err == nil {
		t.Fatal("the open connection survived the cut")
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the open connection hung instead of being reset")
	}
	if c2, err := net.Dial("tcp", p.Addr()); err == nil { // else refused already at connect
		defer c2.Close()
		if _, err := roundTrip(c2, bufio.NewReader(c2), "new during cut", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a new connection during the cut: %v, want a reset", err)
		}
	}
	p.Heal()
	c3, r3 := dial(t, p)
	if got, err := roundTrip(c3, r3, "after", 5*time.Second); err != nil || got != "after\n" {
		t.Fatalf("after heal: %q %v", got, err)
	}
	if s := p.Stats(); s.Reset != 1 || s.Refused < 1 {
		t.Fatalf("stats %+v, want 1 reset and a refusal", s)
	}
}

// A stall holds bytes in both directions; the connection survives and the
// bytes arrive once it ends.
func TestStall(t *testing.T) {
	p := setup(t)
	c, r := dial(t, p)
	if _, err := roundTrip(c, r, "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall(time.Hour)
	// A negative check: nothing may come back while stalled.
	if _, err := roundTrip(c, r, "held", 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("during the stall: %v, want a read timeout", err)
	}
	p.Heal()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("after the stall: %q %v", got, err)
	}
}

// A stall ends by itself after its duration.
func TestStallEnds(t *testing.T) {
	p := setup(t)
	c, r := dial(t, p)
	p.Stall(50 * time.Millisecond)
	if got, err := roundTrip(c, r, "later", 5*time.Second); err != nil || got != "later\n" {
		t.Fatalf("%q %v", got, err)
	}
}

// Healing just as a stall ends by itself must not close the gate twice.
func TestStallHealRace(t *testing.T) {
	p := setup(t)
	for range 200 {
		p.Stall(time.Millisecond)
		time.Sleep(time.Millisecond) // aim at the timer's moment
		p.Heal()
	}
	c, r := dial(t, p)
	if got, err := roundTrip(c, r, "ok", 5*time.Second); err != nil || got != "ok\n" {
		t.Fatalf("%q %v", got, err)
	}
}

// A slowdown delays every chunk and ends.
func TestSlow(t *testing.T) {
	p := setup(t)
	c, r := dial(t, p)
	p.Slow(150*time.Millisecond, time.Hour)
	t0 := time.Now()
	if got, err := roundTrip(c, r, "slow", 5*time.Second); err != nil || got != "slow\n" {
		t.Fatalf("%q %v", got, err)
	}
	if d := time.Since(t0); d < 300*time.Millisecond {
		t.Fatalf("round trip took %s, want at least two added latencies", d)
	}
	p.Heal()
	if got, err := roundTrip(c, r, "fast", 5*time.Second); err != nil || got != "fast\n" {
		t.Fatalf("%q %v", got, err)
	}
}

// nameServer greets each connection with its name.
func nameServer(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = c.Write([]byte(name + "\n")); _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// Retarget resets the open connections and sends new ones to the new
// target.
func TestRetarget(t *testing.T) {
	p, err := Listen("127.0.0.1:0", nameServer(t, "a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	c, r := dial(t, p)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "a\n" {
		t.Fatalf("first server: %q %v", got, err)
	}
	p.Retarget(nameServer(t, "b"))
	if got, err := r.ReadString('\n'); err == nil {
		t.Fatalf("the connection to the old target still reads %q", got)
	}
	c2, r2 := dial(t, p)
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := r2.ReadString('\n'); err != nil || got != "b\n" {
		t.Fatalf("after Retarget: %q %v", got, err)
	}
}
