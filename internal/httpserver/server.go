// Package httpserver serves /metrics, /healthz and /readyz for a binary.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config of the operations endpoint.
type Config struct {
	// Addr to listen on, e.g. ":9465". Empty disables the server.
	Addr string
	// Gatherer whose metrics /metrics exposes.
	Gatherer prometheus.Gatherer
	// Ready reports whether the process should receive work (readiness). A
	// nil Ready is always ready. Liveness (/healthz) is answered while the
	// process serves HTTP at all.
	Ready func() error
	// Detail, when set, is appended to the /readyz body (e.g. the relay's
	// role, "leader" or "standby"), so an operator can see it with curl.
	Detail func() string
	// Logger for server errors.
	Logger *slog.Logger
}

// Serve runs the server until ctx ends, then shuts it down gracefully.
// ready is closed once the listener is bound (may be nil).
func Serve(ctx context.Context, cfg Config, bound func(net.Addr)) error {
	if cfg.Addr == "" {
		<-ctx.Done()
		return nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{ErrorLog: slogAdapter{cfg.Logger}}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if cfg.Ready != nil {
			if err := cfg.Ready(); err != nil {
				msg := "not ready: " + err.Error()
				if cfg.Detail != nil {
					msg += " (" + cfg.Detail() + ")"
				}
				http.Error(w, msg, http.StatusServiceUnavailable)
				return
			}
		}
		body := "ready"
		if cfg.Detail != nil {
			body += " " + cfg.Detail()
		}
		_, _ = w.Write([]byte(body + "\n"))
	})
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	if bound != nil {
		bound(ln.Addr())
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return ServeUntil(ctx, srv, ln, 5*time.Second)
}

// ServeUntil serves srv on ln until ctx ends, then shuts it down, giving
// requests in flight up to grace to finish; connections still open after
// that are closed and the shutdown's error is returned. An error from Serve
// other than the server being closed is returned as it happens. Every HTTP
// endpoint of both binaries (operations, admin, pprof) ends this way.
func ServeUntil(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		<-errc
		return fmt.Errorf("http shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Println(v ...any) {
	if a.l != nil {
		a.l.Error("metrics handler", slog.Any("error", v))
	}
}
