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

// gapParams are what a gap change names: the stream, the range and the
// operator's note (the audit's params).
type gapParams struct {
	Source   string `json:"source"`
	Producer string `json:"producer,omitempty"`
	Topic    string `json:"topic,omitempty"`
	From     int64  `json:"from"`
	To       int64  `json:"to"`
	Note     string `json:"note"`
}

func (p gapParams) validate(noteHint string) error {
	if strings.TrimSpace(p.Source) == "" {
		return badRequest("source is required")
	}
	if (p.Producer == "") != (p.Topic == "") {
		return badRequest("producer and topic go together: both for a producer's stream, neither for a legacy stream")
	}
	if p.From < 1 || p.To < p.From {
		return badRequest("range %d-%d: want 1 <= from <= to", p.From, p.To)
	}
	if strings.TrimSpace(p.Note) == "" {
		return badRequest("note is required: %s", noteHint)
	}
	return nil
}

// ResolveGap puts the note on the unresolved given-up gaps of the source
// within From–To, once per request id, and audits it in the same
// transaction. No such gap: Resolved 0 and the outcome rejected.
func (s *Service) ResolveGap(ctx context.Context, c Caller, req ResolveRequest) (ResolveOutcome, error) {
	var out ResolveOutcome
	params := gapParams{req.Source, req.Producer, req.Topic, req.From, req.To, req.Note}
	if err := params.validate("say what was done about the missing events"); err != nil {
		return out, err
	}
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

// GiveUpRequest asks for an open gap to be given up now instead of at its
// deadline: the missing events are known not to come (their row was skipped
// at the producer, say).
type GiveUpRequest struct {
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

// GiveUpOutcome is the answer to a GiveUpRequest (stored in the audit).
type GiveUpOutcome struct {
	RequestID string `json:"request_id"`
	AuditID   int64  `json:"audit_id"`
	Source    string `json:"source"`
	Producer  string `json:"producer,omitempty"`
	Topic     string `json:"topic,omitempty"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
	// Gaps are the open gaps whose deadline was moved to now: the ones
	// meeting the range and every open gap below it (gaps are given up in
	// seq order). The consumer's gap timer gives them up at its next tick.
	Gaps []GapRange `json:"gaps,omitempty"`
	// Error and ErrorKind (not_found, error) when nothing was requested.
	Error     string `json:"error,omitempty"`
	ErrorKind string `json:"error_kind,omitempty"`
	// Repeated: this is the stored answer of an earlier request with the
	// same id; nothing was done now.
	Repeated bool `json:"repeated,omitempty"`
}

// GapRange is an inclusive seq range.
type GapRange struct {
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// GiveUpGap moves the deadline of the stream's open gaps up to the one
// meeting From–To to now, once per request id, and audits it in the same
// transaction. The running consumer gives them up within its gap check
// interval (a second by default), releasing the parked events behind them,
// with the reason "operator"; the gap then shows as given up and unresolved
// like any other, for `consumer gaps resolve`. No open gap meets the range:
// nothing changes and the outcome is rejected.
func (s *Service) GiveUpGap(ctx context.Context, c Caller, req GiveUpRequest) (GiveUpOutcome, error) {
	var out GiveUpOutcome
	params := gapParams{req.Source, req.Producer, req.Topic, req.From, req.To, req.Note}
	if err := params.validate("say why the missing events will not come"); err != nil {
		return out, err
	}
	by := c.Actor + " via " + c.Via
	id, repeated, err := s.run(ctx, change{requestID: req.RequestID, action: "gap.give_up", caller: c, params: params, note: req.Note},
		func(ctx context.Context, tx pgx.Tx) (any, string) {
			r := GiveUpOutcome{RequestID: req.RequestID, Source: req.Source, Producer: req.Producer, Topic: req.Topic, From: req.From, To: req.To}
			k := seqguard.Stream{Source: req.Source, Producer: req.Producer, Topic: req.Topic}
			gaps, err := s.store.RequestGiveUp(ctx, tx, k, req.From, req.To, by, time.Time{})
			switch {
			case errors.Is(err, seqguard.ErrGapNotFound):
				r.Error, r.ErrorKind = "no open gap of the stream meets that range", "not_found"
				return r, OutcomeRejected
			case err != nil:
				r.Error, r.ErrorKind = err.Error(), "error"
				return r, OutcomeError
			}
			for _, g := range gaps {
				r.Gaps = append(r.Gaps, GapRange{From: g.From, To: g.To})
			}
			return r, OutcomeOK
		}, &out)
	out.AuditID, out.Repeated = id, repeated
	if err != nil {
		return out, err
	}
	s.cfg.Logger.InfoContext(ctx, "admin: gap give-up requested", slog.String("request_id", req.RequestID), slog.String("actor", c.Actor),
		slog.String("via", c.Via), slog.String("source", req.Source), slog.String("producer", req.Producer), slog.String("topic", req.Topic), slog.Int64("from_seq", req.From), slog.Int64("to_seq", req.To),
		slog.Int("gaps", len(out.Gaps)), slog.Bool("repeated", repeated))
	return out, nil
}
