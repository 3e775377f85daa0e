package admin

import (
	"context"
	"errors"
	"net/http"

	"github.com/onceflow/onceflow/internal/reconcile"
)

// LastReconcile is the latest recorded `consumer reconcile` run of the
// service's consumer (nil when none was recorded, or the database lacks
// migration 023).
func (s *Service) LastReconcile(ctx context.Context) (*reconcile.LastRun, error) {
	last, err := reconcile.Last(ctx, s.cfg.Pool, s.cfg.Consumer)
	if errors.Is(err, reconcile.ErrNoRunsTable) {
		return nil, nil
	}
	return last, err
}

// lastReconcile is GET /api/v1/reconcile: {"last": run or null}.
func (h *handler) lastReconcile(w http.ResponseWriter, r *http.Request) {
	last, err := h.svc.LastReconcile(r.Context())
	h.reply(w, r, map[string]any{"last": last}, err)
}
