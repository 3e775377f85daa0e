package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/horizon"
	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// ReplayFunc re-drives one dead or held event through the consumer's
// handlers and sequence guard. The consumer binary builds it around
// inbox.Replay, the one replay path `consumer dlq replay` uses too.
type ReplayFunc func(ctx context.Context, eventID string) (inbox.ReplayResult, error)

// Config configures a Service. Fields are alphabetical.
type Config struct {
	// Consumer is the logical consumer (inbox ledger) acted on (default
	// inbox.DefaultConsumerName).
	Consumer string
	// Group and Topics are the Kafka consumer group and its topics, for
	// lag (optional: without them /lag is empty).
	Group  string
	Topics []string
	// Kafka is an admin client for lag: end offsets and the group's
	// committed offsets (optional: without it lag shows stored offsets
	// only).
	Kafka *kadm.Client
	// KafkaReader makes a short-lived client with the given options added,
	// for lag to look past commit markers: a caught-up partition of a topic
	// written by Kafka transactions ends in a marker, which takes an offset
	// but is no event (optional: without it lag counts markers).
	KafkaReader func(opts ...kgo.Opt) (*kgo.Client, error)
	// Logger receives one INFO line per change (default: discarded).
	Logger *slog.Logger
	// Pool reaches the onceflow schema (required).
	Pool *pgxpool.Pool
	// Replay re-drives one event (required for replays).
	Replay ReplayFunc
	// PlannedEffects says which effects the handlers would make for an
	// event (handlerfile.PlannedEffects), for a replay's dry run to list
	// them beside the ones the ledger records (optional: without it the dry
	// run lists the recorded ones only).
	PlannedEffects func(eventType, eventID string) []effects.Planned
	// ReplayParallel is how many sources a bulk replay works on at once,
	// each source's events in seq order (default 4).
	ReplayParallel int
}

// Service is the console's logic, shared by the HTTP API and the consumer's
// operator commands.
type Service struct {
	cfg   Config
	store *seqguard.PGStore
	// changes bounds the changes running at once: each holds a connection
	// for its audit row while its replays take others.
	changes chan struct{}
}

// maxConcurrentChanges is how many changes one process runs at once; more
// wait their turn.
const maxConcurrentChanges = 2

// NewService checks cfg and returns a Service.
func NewService(cfg Config) (*Service, error) {
	if cfg.Pool == nil {
		return nil, errors.New("admin: Config.Pool is required")
	}
	if cfg.Consumer == "" {
		cfg.Consumer = inbox.DefaultConsumerName
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReplayParallel <= 0 {
		cfg.ReplayParallel = 4
	}
	return &Service{cfg: cfg, store: &seqguard.PGStore{Consumer: cfg.Consumer}, changes: make(chan struct{}, maxConcurrentChanges)}, nil
}

// Consumer is the logical consumer the service acts on.
func (s *Service) Consumer() string { return s.cfg.Consumer }

// Caller is who asks for a change, as the audit records it.
type Caller struct {
	// Actor is the person or system (audit column actor).
	Actor string
	// Via is how: "api:<token name>" or "cli".
	Via string
}

// Summary is the console's headline.
type Summary struct {
	Consumer          string    `json:"consumer"`
	Group             string    `json:"group,omitempty"`
	Topics            []string  `json:"topics,omitempty"`
	OpenGaps          int64     `json:"open_gaps"`
	GivenUpUnresolved int64     `json:"given_up_unresolved"`
	Dead              int64     `json:"dead"`
	Held              int64     `json:"held"`
	Parked            int64     `json:"parked"`
	DBTime            time.Time `json:"db_time"`
	// CleanupHeldSeconds is the age of the oldest transaction or prepared
	// transaction holding back PostgreSQL's cleanup in this database, and
	// CleanupHolder its kind (internal/horizon; "" when none, or when the
	// measurement failed).
	CleanupHeldSeconds float64 `json:"cleanup_held_seconds"`
	CleanupHolder      string  `json:"cleanup_holder,omitempty"`
}

// Summary counts what needs attention.
func (s *Service) Summary(ctx context.Context) (Summary, error) {
	out := Summary{Consumer: s.cfg.Consumer, Group: s.cfg.Group, Topics: s.cfg.Topics}
	err := s.cfg.Pool.QueryRow(ctx, qSummary, s.cfg.Consumer).Scan(&out.OpenGaps, &out.GivenUpUnresolved, &out.Dead,
		&out.Held, &out.Parked, &out.DBTime)
	if err != nil {
		return out, fmt.Errorf("summary: %w", err)
	}
	// What holds back cleanup: shown, never a reason to fail the summary.
	if ages, err := horizon.Measure(ctx, s.cfg.Pool); err == nil {
		for _, k := range []string{horizon.Transaction, horizon.Prepared} {
			if a := ages[k]; a.Seconds > out.CleanupHeldSeconds {
				out.CleanupHeldSeconds, out.CleanupHolder = a.Seconds, k
			}
		}
	}
	return out, nil
}

// Gap is a sequence gap as the console shows it.
type Gap struct {
	ID     int64  `json:"id"`
	Source string `json:"source"`
	// Producer and Topic complete the gap's stream (both empty for a legacy
	// stream).
	Producer     string     `json:"producer"`
	Topic        string     `json:"topic"`
	From         int64      `json:"from"`
	To           int64      `json:"to"`
	State        string     `json:"state"`
	OpenedAt     time.Time  `json:"opened_at"`
	Deadline     time.Time  `json:"deadline"`
	Reason       string     `json:"reason,omitempty"`
	ClosedAt     *time.Time `json:"closed_at,omitempty"`
	ResolvedAt   *time.Time `json:"resolved_at,omitempty"`
	ResolvedNote string     `json:"resolved_note,omitempty"`
	// GiveUpBy names who asked to give the gap up now ("actor via cli").
	GiveUpBy string `json:"give_up_by,omitempty"`
}

// Gaps lists the open gaps and the given-up ones that are unresolved or
// were given up within since (all: every given-up gap).
func (s *Service) Gaps(ctx context.Context, all bool, since time.Duration) ([]Gap, error) {
	from := time.Now().Add(-since)
	if all {
		from = time.Time{}
	}
	recs, err := s.store.ListGaps(ctx, s.cfg.Pool, true, from)
	if err != nil {
		return nil, err
	}
	out := make([]Gap, 0, len(recs))
	for _, g := range recs {
		out = append(out, Gap{ID: g.ID, Source: g.Source, Producer: g.Producer, Topic: g.Topic, From: g.From, To: g.To, State: g.State, OpenedAt: g.OpenedAt,
			Deadline: g.Deadline, Reason: string(g.Reason), ClosedAt: g.ClosedAt, ResolvedAt: g.ResolvedAt, ResolvedNote: g.ResolvedNote, GiveUpBy: g.GiveUpBy})
	}
	return out, nil
}

// DeadLetter is a dead or held inbox row as the console shows it.
type DeadLetter struct {
	EventID   string    `json:"event_id"`
	Status    string    `json:"status"`
	Source    string    `json:"source"`
	Seq       *int64    `json:"seq"`
	EventType string    `json:"event_type"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	ErrorKey  string    `json:"error_key"`
	Group     string    `json:"group"`
	Received  time.Time `json:"received_at"`
	// TraceID is the trace of the request that produced the event (its
	// traceparent's trace id; see docs/tracing.md).
	TraceID string `json:"trace_id,omitempty"`
}

// DeadLetters lists up to limit rows matching p, oldest first.
func (s *Service) DeadLetters(ctx context.Context, p FilterParams, limit int) ([]DeadLetter, error) {
	f, err := p.Filter(time.Now())
	if err != nil {
		return nil, &BadRequest{Err: err}
	}
	rows, err := inbox.FindDeadLetters(ctx, s.cfg.Pool, s.cfg.Consumer, f, limit)
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, 0, len(rows))
	for _, d := range rows {
		out = append(out, DeadLetter{EventID: d.EventID, Status: string(d.Status), Source: d.Source, Seq: d.Seq, EventType: d.EventType,
			Topic: d.Topic, Partition: d.Partition, Offset: d.Offset, Attempts: d.Attempts, LastError: d.LastError,
			ErrorKey: d.ErrorKey, Group: d.Group, Received: d.Received, TraceID: d.TraceID})
	}
	return out, nil
}

// Group is an error group as the console shows it.
type Group struct {
	ID         string    `json:"id"`
	Status     string    `json:"status"`
	Key        string    `json:"key"`
	Sample     string    `json:"sample"`
	Count      int       `json:"count"`
	EventTypes []string  `json:"event_types"`
	Sources    int       `json:"sources"`
	First      time.Time `json:"first_received_at"`
	Last       time.Time `json:"last_received_at"`
}

// Groups groups the rows matching p by error, biggest first.
func (s *Service) Groups(ctx context.Context, p FilterParams, limit int) ([]Group, error) {
	f, err := p.Filter(time.Now())
	if err != nil {
		return nil, &BadRequest{Err: err}
	}
	gs, err := inbox.GroupDeadLetters(ctx, s.cfg.Pool, s.cfg.Consumer, f, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Group, 0, len(gs))
	for _, g := range gs {
		out = append(out, Group{ID: g.ID, Status: string(g.Status), Key: g.Key, Sample: g.Sample, Count: g.Count,
			EventTypes: g.EventTypes, Sources: g.Sources, First: g.First, Last: g.Last})
	}
	return out, nil
}

// AuditEntry is a row of onceflow.admin_audit (without per-event results).
type AuditEntry struct {
	ID         int64           `json:"id"`
	RequestID  string          `json:"request_id"`
	Consumer   string          `json:"consumer"`
	Action     string          `json:"action"`
	Actor      string          `json:"actor"`
	Via        string          `json:"via"`
	Params     json.RawMessage `json:"params"`
	Note       string          `json:"note"`
	Outcome    string          `json:"outcome"`
	Result     json.RawMessage `json:"result"`
	CreatedAt  time.Time       `json:"created_at"`
	FinishedAt *time.Time      `json:"finished_at"`
}

// Audit lists the newest limit changes made to the consumer.
func (s *Service) Audit(ctx context.Context, limit int) ([]AuditEntry, error) {
	rows, err := s.cfg.Pool.Query(ctx, qAudit, s.cfg.Consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var a AuditEntry
		err := r.Scan(&a.ID, &a.RequestID, &a.Consumer, &a.Action, &a.Actor, &a.Via, &a.Params, &a.Note, &a.Outcome,
			&a.Result, &a.CreatedAt, &a.FinishedAt)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return out, nil
}
