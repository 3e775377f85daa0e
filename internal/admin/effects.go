package admin

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/pkg/effects"
)

// HeldEffects lists the effects held for an operator (effects.StatusHeld)
// in s's consumer's scopes and the scopes of no consumer (a library's, an
// agent's), never another consumer's, whose scope starts with scopePrefix
// ("" for all of those), oldest hold first, at most limit.
func (s *Service) HeldEffects(ctx context.Context, scopePrefix string, limit int) ([]effects.Held, error) {
	return effects.ListHeld(ctx, s.cfg.Pool, effects.HeldFilter{Consumer: s.cfg.Consumer, ScopePrefix: scopePrefix}, limit)
}

// ownsScope: a scope of s's consumer, or of no consumer.
func (s *Service) ownsScope(scope string) bool {
	return !strings.HasPrefix(scope, "inbox/") || strings.HasPrefix(scope, effects.ConsumerScopePrefix(s.cfg.Consumer))
}

// EffectRequest asks to resolve a held effect (record what the downstream
// did) or to unhold it (let it send).
type EffectRequest struct {
	RequestID string `json:"request_id"`
	Scope     string `json:"scope"`
	Key       string `json:"key"`
	Note      string `json:"note"`
	// Resolve only: the result found downstream (code and a JSON summary),
	// recorded as the effect's result.
	Code   int             `json:"code,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
}

// EffectOutcome is the answer to an EffectRequest (stored in the audit).
type EffectOutcome struct {
	RequestID string `json:"request_id"`
	AuditID   int64  `json:"audit_id"`
	Scope     string `json:"scope"`
	Key       string `json:"key"`
	// Error and ErrorKind (not_held, error) when nothing changed.
	Error     string `json:"error,omitempty"`
	ErrorKind string `json:"error_kind,omitempty"`
	Repeated  bool   `json:"repeated,omitempty"`
}

func (r EffectRequest) validate(resolve bool) error {
	switch {
	case strings.TrimSpace(r.Note) == "":
		return badRequest("note is required: say what the downstream did, or why the effect may be sent again")
	case r.Key == "":
		return badRequest("key is required")
	case resolve && len(r.Result) > 0 && !json.Valid(r.Result):
		return badRequest("result is not JSON")
	}
	return nil
}

// ResolveEffect records, once per request id, the result an operator found
// downstream for a held effect (effects.Resolve): every later claim of the
// key replays it and nothing is sent; a dead-lettered event of it can then
// be replayed. Audited in the same transaction.
func (s *Service) ResolveEffect(ctx context.Context, c Caller, req EffectRequest) (EffectOutcome, error) {
	if err := req.validate(true); err != nil {
		return EffectOutcome{}, err
	}
	return s.effectChange(ctx, c, req, "effect.resolve", func(ctx context.Context, tx pgx.Tx) error {
		return effects.Resolve(ctx, tx, req.Scope, req.Key, effects.Result{Code: req.Code, Summary: req.Result})
	})
}

// UnholdEffect lets a held effect send, once per request id
// (effects.Unhold): its downstream window restarts, and the next claim
// calls with the same key. Audited in the same transaction.
func (s *Service) UnholdEffect(ctx context.Context, c Caller, req EffectRequest) (EffectOutcome, error) {
	if err := req.validate(false); err != nil {
		return EffectOutcome{}, err
	}
	req.Code, req.Result = 0, nil
	return s.effectChange(ctx, c, req, "effect.unhold", func(ctx context.Context, tx pgx.Tx) error {
		return effects.Unhold(ctx, tx, req.Scope, req.Key)
	})
}

func (s *Service) effectChange(ctx context.Context, c Caller, req EffectRequest, action string, do func(context.Context, pgx.Tx) error) (EffectOutcome, error) {
	var out EffectOutcome
	if !s.ownsScope(req.Scope) {
		return out, badRequest("scope %q belongs to another consumer (this one is %q: its scopes start with %q)", req.Scope, s.cfg.Consumer, effects.ConsumerScopePrefix(s.cfg.Consumer))
	}
	id, repeated, err := s.run(ctx, change{requestID: req.RequestID, action: action, caller: c, params: req, note: req.Note},
		func(ctx context.Context, tx pgx.Tx) (any, string) {
			r := EffectOutcome{RequestID: req.RequestID, Scope: req.Scope, Key: req.Key}
			err := do(ctx, tx)
			var pe *pgconn.PgError
			switch {
			case errors.As(err, &pe) && pe.Code == "55000":
				r.Error, r.ErrorKind = pe.Message, "not_held"
				return r, OutcomeRejected
			case err != nil:
				r.Error, r.ErrorKind = err.Error(), "error"
				return r, OutcomeError
			}
			return r, OutcomeOK
		}, &out)
	out.AuditID, out.Repeated = id, repeated
	if err != nil {
		return out, err
	}
	s.cfg.Logger.InfoContext(ctx, "admin: "+action, slog.String("request_id", req.RequestID), slog.String("actor", c.Actor),
		slog.String("via", c.Via), slog.String("scope", req.Scope), slog.String("key", req.Key), slog.String("outcome_error", out.ErrorKind),
		slog.Bool("repeated", repeated))
	return out, nil
}
