package inbox

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// This file is the seam for the sequence guard (pkg/seqguard). The engine
// calls the guard once per new event, inside the inbox transaction, after the
// event's inbox row was inserted (status 'processed') and before any handler
// runs. The guard answers what to do with the event and may release earlier
// parked events that are now due.

// action is what the guard decided for one event.
type action int

const (
	// actApply runs the handler for the event now.
	actApply action = iota
	// actApplyLate runs the handler with Event.Late set and marks the inbox
	// row late (the event's gap had already been given up).
	actApplyLate
	// actPark keeps the event for later: the engine sets its inbox row to
	// status 'parked' with headers and payload kept; no handler runs.
	actPark
	// actHold keeps the event for an operator: status 'held', payload kept.
	actHold
)

func (a action) String() string {
	switch a {
	case actApply:
		return "apply"
	case actApplyLate:
		return "apply-late"
	case actPark:
		return "park"
	case actHold:
		return "hold"
	}
	return "unknown"
}

// verdict is the guard's answer for one event.
type verdict struct {
	Action action
	// Then are previously parked events that become due because of this
	// one, in the order to apply them, after it. The engine runs the handler
	// for each and sets its inbox row to 'processed' (clearing the kept
	// headers and payload, and setting late when Event.Late is true).
	Then []Event
}

// guard decides, per source, whether an event may be applied now. Admit runs
// in tx, in offset order for one partition; it may read and write its own
// tables (seq state, gaps) through tx, and loads released parked events from
// onceflow.inbox itself. An error aborts the whole batch (it is treated as
// infrastructure trouble and retried, never dead-lettered).
type guard interface {
	Admit(ctx context.Context, tx pgx.Tx, consumer string, ev Event) (verdict, error)
}

// arrivalOrder is the guard used until pkg/seqguard lands: every event is
// applied in the order it arrives.
type arrivalOrder struct{}

func (arrivalOrder) Admit(context.Context, pgx.Tx, string, Event) (verdict, error) {
	return verdict{Action: actApply}, nil
}
