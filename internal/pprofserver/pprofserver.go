// Package pprofserver serves Go's runtime profiles (net/http/pprof) on an
// address of its own, apart from /metrics: profiles show internals (command
// line, goroutine stacks) and cost CPU while taken, so the binaries keep
// them off unless -pprof-addr names an address, best a loopback one such as
// 127.0.0.1:6060.
package pprofserver

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/onceflow/onceflow/internal/httpserver"
)

// Handler serves /debug/pprof/ on a mux of its own (never
// http.DefaultServeMux).
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Serve serves the profiles on addr until ctx ends. An empty addr serves
// nothing and returns when ctx ends. bound (may be nil) is called with the
// listener's address once it is bound.
func Serve(ctx context.Context, addr string, log *slog.Logger, bound func(net.Addr)) error {
	if addr == "" {
		<-ctx.Done()
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if bound != nil {
		bound(ln.Addr())
	}
	// No write timeout: /debug/pprof/profile?seconds=30 writes after 30s.
	srv := &http.Server{Handler: Handler(), ReadHeaderTimeout: 5 * time.Second}
	if log != nil {
		srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	}
	// A profile still being taken is cut off after 2 s: the process is
	// ending, the profile would be of its shutdown.
	if err := httpserver.ServeUntil(ctx, srv, ln, 2*time.Second); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
