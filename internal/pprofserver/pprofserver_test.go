package pprofserver

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestServeProfilesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "127.0.0.1:0", nil, func(a net.Addr) { addrc <- a }) }()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("Serve returned before binding: %v", err)
	}
	for path, want := range map[string]string{
		"/debug/pprof/":                     "goroutine",
		"/debug/pprof/heap?debug=1":         "heap profile",
		"/debug/pprof/goroutine?debug=1":    "goroutine profile",
		"/debug/pprof/cmdline":              "",
		"/debug/pprof/profile?seconds=1":    "",
		"/debug/pprof/allocs?debug=1":       "heap profile",
		"/debug/pprof/threadcreate?debug=1": "threadcreate profile",
	} {
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d, %d bytes, want 200 containing %q", path, resp.StatusCode, len(body), want)
		}
	}
	if resp, err := http.Get("http://" + addr.String() + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET /metrics on the pprof address: %d, want 404", resp.StatusCode)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestServeEmptyAddrServesNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "", nil, func(net.Addr) { t.Error("bound with an empty address") }) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestServeBadAddr(t *testing.T) {
	if err := Serve(context.Background(), "127.0.0.1:notaport", nil, nil); err == nil {
		t.Fatal("Serve with a bad address returned nil")
	}
}
