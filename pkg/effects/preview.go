package effects

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// Planned is an effect a handler would make for an event: its scope, its
// key and its downstream's idempotency window (zero: none known).
type Planned struct {
	Scope, Key string
	Window     time.Duration
}

// What a replay would do with one effect (Preview.Verdict).
const (
	// VerdictCall: no ledger row; the handler would call the downstream.
	VerdictCall = "call"
	// VerdictCallAgain: an intent without a result; the handler would call
	// again with the same key (inside the window, the downstream dedups).
	VerdictCallAgain = "call again"
	// VerdictLedger: done; answered from the ledger, nothing sent.
	VerdictLedger = "from ledger"
	// VerdictHeld: held for an operator; the claim is refused and the event
	// fails again until the effect is resolved or unheld.
	VerdictHeld = "held"
	// VerdictPastWindow: an intent older than its downstream's window; the
	// handler would hold it rather than send (nothing sent).
	VerdictPastWindow = "past window: would hold"
	// VerdictNotCalled: recorded for the event, but no handler of the
	// current configuration makes it; nothing sent.
	VerdictNotCalled = "not called by the handlers"
)

// Preview is one effect of a replayed event as a dry run sees it.
type Preview struct {
	Scope    string `json:"scope"`
	Key      string `json:"key"`
	Status   string `json:"status,omitempty"` // ledger status; "" when there is no row
	Attempts int    `json:"attempts,omitempty"`
	// AgeSeconds is how long ago the key's window began (first claim, or
	// the last unhold); WindowSeconds the downstream's window, when known.
	AgeSeconds    float64 `json:"age_seconds,omitempty"`
	WindowSeconds float64 `json:"window_seconds,omitempty"`
	Verdict       string  `json:"verdict"`
}

// Sends reports whether a replay would send a request for this effect.
func (p Preview) Sends() bool { return p.Verdict == VerdictCall || p.Verdict == VerdictCallAgain }

const qPreview = `SELECT scope, idempotency_key, status, attempts,
       extract(epoch FROM now() - COALESCE(unheld_at, created_at))::float8
  FROM onceflow.effects
 WHERE left(scope, length($1)) = $1
   AND (event_id = $2 OR (scope, idempotency_key) IN (SELECT s, k FROM unnest($3::text[], $4::text[]) AS p (s, k)))
 ORDER BY scope, idempotency_key
 LIMIT 100`

// PreviewEvent tells what replaying an event would do with its effects:
// planned are the ones the handlers would make (PlannedEffects of a
// handler file; nil when unknown, empty when they make none), and the ledger adds every row under
// scopePrefix (a consumer's ConsumerScopePrefix) that names the event
// (event_id) or has a planned scope and key.
//
// It can know only what is recorded or planned: an effect a Go or Python
// handler makes under a key it builds itself, in a scope outside
// scopePrefix or without the event's id, is not seen until it is called.
// With planned nil, a recorded intent is taken to be called again (the
// handler's window unknown).
func PreviewEvent(ctx context.Context, db dbtx.DB, scopePrefix, eventID string, planned []Planned) ([]Preview, error) {
	scopes, keys := make([]string, len(planned)), make([]string, len(planned))
	for i, p := range planned {
		scopes[i], keys[i] = p.Scope, p.Key
	}
	rows, err := db.Query(ctx, qPreview, scopePrefix, eventID, scopes, keys)
	if err != nil {
		return nil, fmt.Errorf("effects: preview %q: %w", eventID, err)
	}
	recorded, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Preview, error) {
		var p Preview
		err := r.Scan(&p.Scope, &p.Key, &p.Status, &p.Attempts, &p.AgeSeconds)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("effects: preview %q: %w", eventID, err)
	}
	type id struct{ scope, key string }
	byID := map[id]int{}
	for i, p := range recorded {
		byID[id{p.Scope, p.Key}] = i
	}
	out := make([]Preview, 0, len(recorded)+len(planned))
	seen := map[id]bool{}
	for _, pl := range planned {
		k := id{pl.Scope, pl.Key}
		if seen[k] {
			continue
		}
		seen[k] = true
		p := Preview{Scope: pl.Scope, Key: pl.Key, WindowSeconds: pl.Window.Seconds()}
		if i, ok := byID[k]; ok {
			r := recorded[i]
			p.Status, p.Attempts, p.AgeSeconds = r.Status, r.Attempts, r.AgeSeconds
		}
		p.Verdict = verdict(p, pl.Window, true)
		out = append(out, p)
	}
	for _, r := range recorded {
		if seen[id{r.Scope, r.Key}] {
			continue
		}
		r.Verdict = verdict(r, 0, planned == nil)
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Scope != out[j].Scope {
			return out[i].Scope < out[j].Scope
		}
		return out[i].Key < out[j].Key
	})
	return out, nil
}

// verdict is what a replay does with p; called says whether a handler
// would claim it (planned, or the plan is unknown).
func verdict(p Preview, window time.Duration, called bool) string {
	switch {
	case !called:
		return VerdictNotCalled
	case p.Status == StatusDone:
		return VerdictLedger
	case p.Status == StatusHeld:
		return VerdictHeld
	case p.Status == "":
		return VerdictCall
	case window > 0 && time.Duration(p.AgeSeconds*float64(time.Second)) > window:
		return VerdictPastWindow
	}
	return VerdictCallAgain
}
