package admin

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// Replay limits.
const (
	// DefaultReplayLimit is how many events one replay request applies at
	// most unless it says otherwise; Remaining tells how many more matched.
	DefaultReplayLimit = 10000
	// MaxReplayLimit is the highest limit a request may ask for.
	MaxReplayLimit = 100000
	// maxEventsListed bounds the per-event list of an outcome.
	maxEventsListed = 1000
	// dryRunPreview is how many events a dry run lists.
	dryRunPreview = 20
)

// Per-event results beyond inbox.ReplayResult.
const (
	ResultFailed       = "failed"
	ResultSkipped      = "skipped"
	ResultNotFound     = "not found"
	ResultNotAttempted = "not attempted"
	ResultWouldReplay  = "would replay"
)

// ReplayRequest asks to re-drive dead (or held) events through the handlers
// and the sequence guard: one event, the events matching a filter, or all.
type ReplayRequest struct {
	// RequestID makes the replay idempotent (required unless DryRun).
	RequestID string `json:"request_id,omitempty"`
	// Note says why (required unless one event or DryRun).
	Note string `json:"note,omitempty"`
	// DryRun counts what would be replayed and changes nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Exactly one of EventID, Filter and All.
	EventID string       `json:"event_id,omitempty"`
	Filter  FilterParams `json:"filter,omitzero"`
	All     bool         `json:"all,omitempty"`
	// Expect, when set, refuses the replay unless exactly this many events
	// match (the count a dry run showed the operator).
	Expect *int `json:"expect,omitempty"`
	// Limit is the most events replayed (default DefaultReplayLimit).
	Limit int `json:"limit,omitempty"`
}

// EventOutcome is what a replay did with one event.
type EventOutcome struct {
	EventID string `json:"event_id"`
	Source  string `json:"source"`
	Seq     *int64 `json:"seq"`
	// Result is an inbox.ReplayResult ("replayed", "replayed late", "parked
	// behind a sequence gap", "already processed") or failed, skipped (an
	// earlier event of the source failed, so its later ones wait), not
	// found, not attempted (stopped), would replay (dry run).
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
	// Effects (dry run): the event's external effects and what a replay
	// would do with each (effects.PreviewEvent): call, call again, answer
	// from the ledger, refuse as held, hold as past its window.
	Effects []effects.Preview `json:"effects,omitempty"`
}

// ReplayOutcome is the answer to a ReplayRequest (stored in the audit).
type ReplayOutcome struct {
	RequestID string `json:"request_id,omitempty"`
	AuditID   int64  `json:"audit_id,omitempty"`
	DryRun    bool   `json:"dry_run,omitempty"`
	// Matched is how many events matched; Sources how many sources they
	// belong to; Attempted how many this request took on (at most the
	// limit); Remaining how many more matched beyond the limit.
	Matched   int `json:"matched"`
	Sources   int `json:"sources"`
	Attempted int `json:"attempted"`
	Remaining int `json:"remaining"`
	// Per result.
	Replayed         int `json:"replayed"`
	ReplayedLate     int `json:"replayed_late"`
	Parked           int `json:"parked"`
	AlreadyProcessed int `json:"already_processed"`
	Failed           int `json:"failed"`
	Skipped          int `json:"skipped"`
	NotFound         int `json:"not_found"`
	NotAttempted     int `json:"not_attempted"`
	// Events are the events in the order they were applied (per source by
	// seq), at most 1000; a dry run lists the first 20.
	Events          []EventOutcome `json:"events"`
	EventsTruncated bool           `json:"events_truncated,omitempty"`
	// Groups are the error groups a dry run would touch.
	Groups []Group `json:"groups,omitempty"`
	// Error and ErrorKind (count_changed, not_found, stopped) when the
	// replay was refused or stopped part-way.
	Error     string `json:"error,omitempty"`
	ErrorKind string `json:"error_kind,omitempty"`
	// Repeated: this is the stored answer of an earlier request with the
	// same id; nothing was done now.
	Repeated bool `json:"repeated,omitempty"`
}

// Replay re-drives the events req names through s's ReplayFunc (the same
// path as `consumer dlq replay`: the handler and the sequence guard in one
// transaction per event). Events are applied per source in seq order,
// several sources at once; when an event of a source fails, the source's
// later events are skipped (they would otherwise overtake it). A dry run
// counts and changes nothing; anything else happens once per request id and
// is audited.
func (s *Service) Replay(ctx context.Context, c Caller, req ReplayRequest) (ReplayOutcome, error) {
	var out ReplayOutcome
	n := 0
	for _, set := range []bool{req.EventID != "", !req.Filter.Empty(), req.All} {
		if set {
			n++
		}
	}
	switch {
	case n == 0:
		return out, badRequest("say what to replay: event_id, a filter, or all")
	case n > 1:
		return out, badRequest("give only one of event_id, filter and all")
	case !req.DryRun && req.EventID == "" && strings.TrimSpace(req.Note) == "":
		return out, badRequest("note is required to replay more than one event: say why (the fix that was made)")
	case req.Limit < 0 || req.Limit > MaxReplayLimit:
		return out, badRequest("limit %d: want 1 to %d", req.Limit, MaxReplayLimit)
	}
	if req.Limit == 0 {
		req.Limit = DefaultReplayLimit
	}
	f, err := req.Filter.Filter(time.Now())
	if err != nil {
		return out, &BadRequest{Err: err}
	}
	if req.EventID != "" {
		f = inbox.DeadLetterFilter{EventIDs: []string{req.EventID}}
	}
	if req.DryRun {
		return s.dryRun(ctx, f, req)
	}
	if s.cfg.Replay == nil {
		return out, errors.New("admin: this service cannot replay (no handlers configured)")
	}
	params := req
	params.RequestID, params.DryRun = "", false
	// The intent, committed before the first event is applied: what the
	// request matches now. The outcome replaces it when the replay ends.
	intent := ReplayOutcome{RequestID: req.RequestID, Matched: 1, Sources: 1, Attempted: 1, Events: []EventOutcome{}}
	if req.EventID == "" {
		if intent.Matched, intent.Sources, err = inbox.CountDeadLetters(ctx, s.cfg.Pool, s.cfg.Consumer, f); err != nil {
			return out, err
		}
		intent.Attempted = min(intent.Matched, req.Limit)
		intent.Remaining = intent.Matched - intent.Attempted
	}
	id, repeated, err := s.run(ctx, change{requestID: req.RequestID, action: "dlq.replay", caller: c, params: params, note: req.Note, intent: intent},
		func(ctx context.Context, _ pgx.Tx) (any, string) {
			r := ReplayOutcome{RequestID: req.RequestID}
			if req.EventID != "" {
				return r, s.replayOne(ctx, req.EventID, &r)
			}
			return r, s.replayMatching(ctx, f, req, &r)
		}, &out)
	out.AuditID, out.Repeated = id, repeated
	if err != nil {
		return out, err
	}
	s.cfg.Logger.InfoContext(ctx, "admin: dead letters replayed", slog.String("request_id", req.RequestID),
		slog.String("actor", c.Actor), slog.String("via", c.Via), slog.Int("matched", out.Matched), slog.Int("attempted", out.Attempted),
		slog.Int("replayed", out.Replayed), slog.Int("replayed_late", out.ReplayedLate), slog.Int("parked", out.Parked),
		slog.Int("already_processed", out.AlreadyProcessed), slog.Int("failed", out.Failed), slog.Int("skipped", out.Skipped),
		slog.Bool("repeated", repeated))
	return out, nil
}

func (s *Service) dryRun(ctx context.Context, f inbox.DeadLetterFilter, req ReplayRequest) (ReplayOutcome, error) {
	out := ReplayOutcome{DryRun: true, Events: []EventOutcome{}}
	var err error
	if out.Matched, out.Sources, err = inbox.CountDeadLetters(ctx, s.cfg.Pool, s.cfg.Consumer, f); err != nil {
		return out, err
	}
	out.Attempted = min(out.Matched, req.Limit)
	out.Remaining = out.Matched - out.Attempted
	rows, err := inbox.DeadLettersInReplayOrder(ctx, s.cfg.Pool, s.cfg.Consumer, f, dryRunPreview)
	if err != nil {
		return out, err
	}
	prefix := effects.ConsumerScopePrefix(s.cfg.Consumer)
	for _, d := range rows {
		var planned []effects.Planned
		if s.cfg.PlannedEffects != nil {
			// Known, even when empty: a recorded effect no handler makes
			// is not called.
			planned = append([]effects.Planned{}, s.cfg.PlannedEffects(d.EventType, d.EventID)...)
		}
		fx, err := effects.PreviewEvent(ctx, s.cfg.Pool, prefix, d.EventID, planned)
		if err != nil {
			return out, err
		}
		out.Events = append(out.Events, EventOutcome{EventID: d.EventID, Source: d.Source, Seq: d.Seq, Result: ResultWouldReplay, Effects: fx})
	}
	out.EventsTruncated = out.Matched > len(rows)
	gs, err := inbox.GroupDeadLetters(ctx, s.cfg.Pool, s.cfg.Consumer, f, 20)
	if err != nil {
		return out, err
	}
	for _, g := range gs {
		out.Groups = append(out.Groups, Group{ID: g.ID, Status: string(g.Status), Key: g.Key, Sample: g.Sample, Count: g.Count,
			EventTypes: g.EventTypes, Sources: g.Sources, First: g.First, Last: g.Last})
	}
	if req.Expect != nil && *req.Expect != out.Matched {
		out.Error, out.ErrorKind = (&CountChanged{Expected: *req.Expect, Matched: out.Matched}).Error(), "count_changed"
	}
	return out, nil
}

// replayOne replays one event whatever its status (a processed one is
// "already processed", as `consumer dlq replay EVENT-ID` always said).
func (s *Service) replayOne(ctx context.Context, id string, r *ReplayOutcome) string {
	ev := s.replayEvent(ctx, inbox.DeadLetter{EventID: id})
	if ev.Result == ResultNotFound {
		r.Error, r.ErrorKind = "event "+id+" is not in the inbox of consumer "+s.cfg.Consumer, "not_found"
		r.Events = []EventOutcome{ev}
		r.tally()
		return OutcomeRejected
	}
	r.Matched, r.Sources, r.Attempted = 1, 1, 1
	r.Events = []EventOutcome{ev}
	r.tally()
	return r.outcome()
}

func (s *Service) replayMatching(ctx context.Context, f inbox.DeadLetterFilter, req ReplayRequest, r *ReplayOutcome) string {
	var err error
	r.Events = []EventOutcome{}
	if r.Matched, r.Sources, err = inbox.CountDeadLetters(ctx, s.cfg.Pool, s.cfg.Consumer, f); err != nil {
		r.Error, r.ErrorKind = err.Error(), "stopped"
		return OutcomeError
	}
	if req.Expect != nil && *req.Expect != r.Matched {
		r.Error, r.ErrorKind = (&CountChanged{Expected: *req.Expect, Matched: r.Matched}).Error(), "count_changed"
		return OutcomeRejected
	}
	rows, err := inbox.DeadLettersInReplayOrder(ctx, s.cfg.Pool, s.cfg.Consumer, f, req.Limit)
	if err != nil {
		r.Error, r.ErrorKind = err.Error(), "stopped"
		return OutcomeError
	}
	r.Attempted = len(rows)
	r.Remaining = max(r.Matched-len(rows), 0)

	// Per source, in order; sources in parallel.
	var bySource [][]int
	at := map[string]int{}
	for i, d := range rows {
		j, ok := at[d.Source]
		if !ok {
			j = len(bySource)
			at[d.Source] = j
			bySource = append(bySource, nil)
		}
		bySource[j] = append(bySource[j], i)
	}
	results := make([]EventOutcome, len(rows))
	jobs := make(chan []int)
	var wg sync.WaitGroup
	for range min(s.cfg.ReplayParallel, len(bySource)) {
		wg.Go(func() {
			for idx := range jobs {
				failed := false
				for _, i := range idx {
					d := rows[i]
					switch {
					case failed:
						results[i] = EventOutcome{EventID: d.EventID, Source: d.Source, Seq: d.Seq, Result: ResultSkipped,
							Error: "an earlier event of its source failed; replay it first"}
					case ctx.Err() != nil:
						results[i] = EventOutcome{EventID: d.EventID, Source: d.Source, Seq: d.Seq, Result: ResultNotAttempted}
					default:
						results[i] = s.replayEvent(ctx, d)
						failed = results[i].Result == ResultFailed || results[i].Result == ResultNotAttempted
					}
				}
			}
		})
	}
	for _, idx := range bySource {
		jobs <- idx
	}
	close(jobs)
	wg.Wait()
	r.Events = results
	r.tally()
	if r.NotAttempted > 0 {
		r.Error, r.ErrorKind = "stopped part-way: "+context.Cause(ctx).Error(), "stopped"
	}
	return r.outcome()
}

// replayEvent replays one event through the ReplayFunc.
func (s *Service) replayEvent(ctx context.Context, d inbox.DeadLetter) EventOutcome {
	ev := EventOutcome{EventID: d.EventID, Source: d.Source, Seq: d.Seq}
	res, err := s.cfg.Replay(ctx, d.EventID)
	switch {
	case err == nil:
		ev.Result = string(res)
	case errors.Is(err, inbox.ErrNotFound):
		ev.Result = ResultNotFound
	case ctx.Err() != nil:
		ev.Result, ev.Error = ResultNotAttempted, err.Error() // rolled back
	default:
		ev.Result, ev.Error = ResultFailed, err.Error()
	}
	return ev
}

// tally counts the events' results and bounds the list.
func (r *ReplayOutcome) tally() {
	for _, e := range r.Events {
		switch e.Result {
		case string(inbox.Replayed):
			r.Replayed++
		case string(inbox.ReplayedLate):
			r.ReplayedLate++
		case string(inbox.ReplayParked):
			r.Parked++
		case string(inbox.AlreadyProcessed):
			r.AlreadyProcessed++
		case ResultFailed:
			r.Failed++
		case ResultSkipped:
			r.Skipped++
		case ResultNotFound:
			r.NotFound++
		case ResultNotAttempted:
			r.NotAttempted++
		}
	}
	if len(r.Events) > maxEventsListed {
		r.Events, r.EventsTruncated = r.Events[:maxEventsListed], true
	}
}

func (r *ReplayOutcome) outcome() string {
	switch {
	case r.NotAttempted > 0:
		return OutcomeError
	case r.Failed > 0 || r.Skipped > 0 || r.NotFound > 0:
		return OutcomePartial
	}
	return OutcomeOK
}
