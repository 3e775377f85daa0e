package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox/status"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// DeadLetter is an inbox row that needs an operator: status "dead" (handler
// kept failing, or the record was malformed) or "held".
type DeadLetter struct {
	EventID   string
	Status    status.Status
	Source    string
	Seq       *int64
	EventType string
	Topic     string
	Partition int32
	Offset    int64
	Attempts  int
	LastError string
	Received  time.Time
	// ErrorKey is LastError normalised for grouping, and Group the ID of
	// its DeadLetterGroup (set by FindDeadLetters and
	// DeadLettersInReplayOrder).
	ErrorKey string
	Group    string
	// TraceID is the W3C trace id of the event's traceparent (empty when it
	// carried none): the trace of the request that produced it.
	TraceID string
}

// ListDeadLetters returns up to limit dead and held rows of consumer, oldest
// first. FindDeadLetters does the same with a filter.
func ListDeadLetters(ctx context.Context, pool dbtx.DB, consumer string, limit int) ([]DeadLetter, error) {
	return FindDeadLetters(ctx, pool, consumer, DeadLetterFilter{}, limit)
}

// ReplayResult says what Replay did.
type ReplayResult string

// Replay results.
const (
	// Replayed: the handler ran and the row is now processed.
	Replayed ReplayResult = "replayed"
	// ReplayedLate: the handler ran with Event.Late set (the sequence
	// guard had applied later seqs of its source already: its gap was given
	// up), and the row is now processed and marked late.
	ReplayedLate ReplayResult = "replayed late"
	// ReplayParked: the sequence guard parked the event behind a gap of
	// earlier seqs; it is applied when the gap fills or is given up.
	ReplayParked ReplayResult = "parked behind a sequence gap"
	// AlreadyProcessed: the event had been applied; nothing was done.
	AlreadyProcessed ReplayResult = "already processed"
)

// ReplayConfig is what a replay needs besides the event id: the handler,
// the database and the sequence guard's settings. Give it the running
// consumer's settings (the CLI takes the same flags), so that a replayed
// event that parks opens its gap with its class's timeout and the parked
// bound holds as in the consumer. Zero fields take Config's defaults.
type ReplayConfig struct {
	// ConsumerName owns the inbox row (default DefaultConsumerName).
	ConsumerName string
	// FirstSeen, GapTimeout, GapTimeouts and MaxParked are as in Config.
	FirstSeen   seqguard.FirstSeen
	GapTimeout  time.Duration
	GapTimeouts []GapTimeout
	// Handler applies the event (required).
	Handler   BatchHandler
	MaxParked int
	// Pool is the database holding onceflow.inbox (required).
	Pool dbtx.DB
}

// guardConfig is the Config the sequence guard of a replay reads.
func (c ReplayConfig) guardConfig() Config {
	return Config{ConsumerName: c.ConsumerName, FirstSeen: c.FirstSeen, GapTimeout: c.GapTimeout,
		GapTimeouts: c.GapTimeouts, MaxParked: c.MaxParked}.WithDefaults()
}

// Replay is ReplayConfig.Replay with the guard's default settings.
func Replay(ctx context.Context, pool dbtx.DB, consumer string, h BatchHandler, eventID string) (ReplayResult, error) {
	return ReplayConfig{ConsumerName: consumer, Handler: h, Pool: pool}.Replay(ctx, eventID)
}

// Replay re-drives one dead (or held) event through the same inbox path as
// live consumption: in one transaction it locks the inbox row, runs h and
// marks the row processed. Replaying an event that is already processed is a
// no-op, and two concurrent replays of one event apply it once (the second
// waits for the first's lock and then finds it processed). When h fails, the
// row stays dead with attempts incremented and last_error updated, and the
// error is returned.
//
// A dead event of a source the sequence guard tracks (the consumer runs
// with OrderSeq) goes through the guard, as if it had just arrived: if it is
// the next seq it is applied and releases the events parked behind it (the
// handler runs for each, in order, in the same transaction); if its gap was
// given up meanwhile it is delivered marked late; if earlier seqs are still
// missing it is parked. A held event (a late event kept for an operator) is
// delivered marked late.
//
// A malformed record is decoded again from its kept headers and payload; if
// it is still malformed, Replay fails without calling h.
func (c ReplayConfig) Replay(ctx context.Context, eventID string) (ReplayResult, error) {
	gcfg := c.guardConfig()
	if err := gcfg.validateGuard(); err != nil {
		return "", err
	}
	if c.Pool == nil || c.Handler == nil {
		return "", &ConfigError{Field: "Pool/Handler", Reason: "are required for a replay"}
	}
	pool, h, consumer := c.Pool, c.Handler, gcfg.ConsumerName
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	var (
		st                       status.Status
		source, eventType, topic string
		seq                      *int64
		partition                int32
		offset                   int64
		attempts                 int
		headers, payload         []byte
		received                 time.Time
	)
	err = tx.QueryRow(ctx, qLockForReplay, consumer, eventID).Scan(&st, &source, &seq, &eventType,
		&topic, &partition, &offset, &attempts, &headers, &payload, &received)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: %s (consumer %s)", ErrNotFound, eventID, consumer)
	}
	if err != nil {
		return "", fmt.Errorf("lock inbox row: %w", err)
	}
	switch st {
	case status.Processed:
		return AlreadyProcessed, nil
	case status.Dead, status.Held:
	default:
		return "", fmt.Errorf("event %s is %s: the sequence guard owns it", eventID, st)
	}
	rec, err := recordFromRow(topic, partition, offset, headers, payload)
	if err != nil {
		return "", err
	}
	env, err := envelope.Decode(rec, len(payload)+1)
	if err != nil {
		return "", fmt.Errorf("event %s is still malformed: %w", eventID, err)
	}
	ev := eventFromEnvelope(env, topic, partition, offset)
	ev.Key = []byte(ev.Source)

	// Which events to apply, in order.
	evs, res := []Event{ev}, Replayed
	if st == status.Held {
		evs[0].Late, res = true, ReplayedLate
	} else {
		var guarded bool
		if err := tx.QueryRow(ctx, qHasSeqState, consumer, ev.Source, ev.stream().Producer, ev.stream().Topic).Scan(&guarded); err != nil {
			return "", fmt.Errorf("read seq state: %w", err)
		}
		if guarded {
			if evs, res, err = replayThroughGuard(ctx, tx, &gcfg, ev, headers, payload); err != nil {
				return "", err
			}
		}
	}

	herr := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v", r)
			}
		}()
		if len(evs) == 0 {
			return nil
		}
		return h.HandleBatch(withConsumerName(ctx, consumer), tx, evs)
	}()
	if herr != nil {
		_ = tx.Rollback(ctx)
		// Recorded like the engine records a dead letter's reason (without
		// the "handler for event …" wrapping), so that the event keeps its
		// error group.
		cause := herr
		var he *HandlerError
		if errors.As(herr, &he) {
			cause = he.Err
		}
		if _, err := pool.Exec(ctx, qReplayFailed, consumer, eventID, safeText(cause.Error())); err != nil {
			return "", errors.Join(&HandlerError{EventID: eventID, Err: cause}, fmt.Errorf("record failed replay: %w", err))
		}
		return "", &HandlerError{EventID: eventID, Err: cause}
	}
	if res != ReplayParked {
		if _, err := tx.Exec(ctx, qMarkApplied, consumer, eventID, res == ReplayedLate); err != nil {
			return "", fmt.Errorf("mark replayed event processed: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	return res, nil
}

// replayThroughGuard admits a dead event to the sequence guard as if it had
// just arrived and returns the events to apply, in order.
func replayThroughGuard(ctx context.Context, tx pgx.Tx, cfg *Config, ev Event, headers, payload []byte) ([]Event, ReplayResult, error) {
	// The guard expects the row as the inbox insert leaves it.
	if _, err := tx.Exec(ctx, qReplayAdmit, cfg.ConsumerName, ev.EventID); err != nil {
		return nil, "", fmt.Errorf("replay: %w", err)
	}
	g := newSeqGuard(cfg)
	l, err := g.store.Lock(ctx, tx, []seqguard.Stream{ev.stream()}, cfg.Clock())
	if err != nil {
		return nil, "", fmt.Errorf("sequence guard: %w", err)
	}
	now := l.Now() // the database's clock
	// Deliver-late whatever the consumer's policy: an operator asked for it.
	out, err := l.Receive(ctx, seqguard.Event{EventID: ev.EventID, Source: ev.Source, Producer: ev.Producer, Seq: ev.Seq, EventType: ev.EventType,
		Topic: ev.Topic, Partition: ev.Partition, Offset: ev.Offset, Headers: headers, Payload: payload},
		now, g.policy(ev.EventType))
	if err != nil {
		return nil, "", fmt.Errorf("sequence guard: %w", err)
	}
	if err := l.Flush(ctx); err != nil {
		return nil, "", fmt.Errorf("sequence guard: %w", err)
	}
	evs, err := g.events(out, &ev)
	if err != nil {
		return nil, "", err
	}
	res := ReplayParked
	for _, a := range out.Apply {
		if a.Current {
			res = Replayed
			if a.Late {
				res = ReplayedLate
			}
		}
	}
	for _, st := range out.Steps {
		switch st.Kind {
		case seqguard.StepHold, seqguard.StepSeqConflict:
			return nil, "", fmt.Errorf("event %s: the sequence guard holds it (seq conflict): see consumer dlq list", ev.EventID)
		case seqguard.StepDuplicate:
			// The guard moved past this seq in order (a released parked
			// event dead-lettered in place), but a dead row was never
			// applied: it is delivered late.
			late := ev
			late.Late = true
			return []Event{late}, ReplayedLate, nil
		}
	}
	return evs, res, nil
}

// AsBatchHandler returns h as a BatchHandler (h itself when it already is
// one), for Replay.
func AsBatchHandler(h Handler) BatchHandler { return asBatch(h) }
