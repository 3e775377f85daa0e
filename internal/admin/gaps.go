package admin

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/seqguard"
)

// ResolveRequest records what was done about a given-up gap.
type ResolveRequest struct {
	RequestID string `json:"request_id"`
	Source    string `json:"source"`
	// Producer and Topic name the gap's stream with Source; both empty for
	// a legacy stream.
	Producer string `json:"producer,omitempty"`
	Topic    string `json:"topic,omitempty"`
	From     int64  `json:"from"`
	To       int64  `json:"to"`
	Note     string `json:"note"`
}

// ResolveOutcome is the answer to a ResolveRequest (stored in the audit).
type ResolveOutcome struct {
	RequestID string `json:"request_id"`
	AuditID   int64  `json:"audit_id"`
	Source    string `json:"source"`
	Producer  string `json:"producer,omitempty"`
	Topic     string `json:"topic,omitempty"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
	// Resolved is how many given-up gaps within the range got the note.
	Resolved int64 `json:"resolved"`
	// Error and ErrorKind (not_found, error) when nothing was resolved.
	Error     string `json:"error,omitempty"`
	ErrorKind string `json:"error_kind,omitempty"`
	// Repeated: this is the stored answer of an earlier request with the
	// same id; nothing was done now.
	Repeated bool `json:"repeated,omitempty"`
}

// ResolveGap puts the note on the unresolved given-up gaps of the source
// within From–To, once per request id, and audits it in the same
// transaction. No such gap: Resolved 0 and the outcome rejected.
func (s *Service) ResolveGap(ctx context.Context, c Caller, req ResolveRequest) (ResolveOutcome, error) {
	var out ResolveOutcome
	if strings.TrimSpace(req.Source) == "" {
		return out, badRequest("source is required")
	}
	if (req.Producer == "") != (req.Topic == "") {
		return out, badRequest("producer and topic go together: both for a producer's stream, neither for a legacy stream")
	}
	if req.From < 1 || req.To < req.From {
		return out, badRequest("range %d-%d: want 1 <= from <= to", req.From, req.To)
	}
	if strings.TrimSpace(req.Note) == "" {
		return out, badRequest("note is required: say what was done about the missing events")
	}
	params := struct {
		Source   string `json:"source"`
		Producer string `json:"producer,omitempty"`
		Topic    string `json:"topic,omitempty"`
		From     int64  `json:"from"`
		To       int64  `json:"to"`
		Note     string `json:"note"`
	}{req.Source, req.Producer, req.Topic, req.From, req.To, req.Note}
	id, repeated, err := s.run(ctx, change{requestID: req.RequestID, action: "gap.resolve", caller: c, params: params, note: req.Note},
		func(ctx context.Context, tx pgx.Tx) (any, string) {
			r := ResolveOutcome{RequestID: req.RequestID, Source: req.Source, Producer: req.Producer, Topic: req.Topic, From: req.From, To: req.To}
			k := seqguard.Stream{Source: req.Source, Producer: req.Producer, Topic: req.Topic}
			n, err := s.store.ResolveGap(ctx, tx, k, req.From, req.To, req.Note, time.Now())
			switch {
			case errors.Is(err, seqguard.ErrGapNotFound):
				r.Error, r.ErrorKind = "no unresolved given-up gap of the stream lies within that range", "not_found"
				return r, OutcomeRejected
			case err != nil:
				r.Error, r.ErrorKind = err.Error(), "error"
				return r, OutcomeError
			}
			r.Resolved = n
			return r, OutcomeOK
		}, &out)
	out.AuditID, out.Repeated = id, repeated
	if err != nil {
		return out, err
	}
	s.cfg.Logger.InfoContext(ctx, "admin: gap resolved", slog.String("request_id", req.RequestID), slog.String("actor", c.Actor),
		slog.String("via", c.Via), slog.String("source", req.Source), slog.String("producer", req.Producer), slog.String("topic", req.Topic), slog.Int64("from_seq", req.From), slog.Int64("to_seq", req.To),
		slog.Int64("resolved", out.Resolved), slog.Bool("repeated", repeated))
	return out, nil
}
