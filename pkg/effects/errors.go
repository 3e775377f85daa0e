package effects

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrHeld is wrapped by every *HeldError: the effect is held for an
// operator and nothing was sent.
var ErrHeld = errors.New("effects: effect held for an operator")

// HeldError says that an effect is held (status held): a retry of it came
// after its downstream's idempotency window with no reconcile hook to ask
// the downstream what became of the earlier attempts, so nothing was sent.
// Every claim of the key fails with it until an operator resolves the
// effect (Resolve: records what the downstream did) or lets it send
// (Unhold).
type HeldError struct {
	Scope, Key string
	// Attempts and Age are set when this call held the effect: the claims
	// so far and how long ago the window began (the first claim, or the
	// last Unhold). A claim refused because the effect was held earlier
	// leaves them zero.
	Attempts int
	Age      time.Duration
	// Window is the downstream's window the retry came after (zero when the
	// claim was refused).
	Window time.Duration
}

func (e *HeldError) Error() string {
	if e.Window > 0 {
		return fmt.Sprintf("effects: effect %q (scope %q) held: attempt %d is %s after the first, past the downstream's idempotency window of %s, and there is no reconcile hook; nothing was sent: an operator must find out whether the earlier attempts reached the downstream (consumer effects resolve / unhold)",
			e.Key, e.Scope, e.Attempts, e.Age.Round(time.Second), e.Window)
	}
	return fmt.Sprintf("effects: effect %q (scope %q) is held for an operator (a retry came after the downstream's idempotency window); nothing was sent: resolve it or let it send (consumer effects resolve / unhold)",
		e.Key, e.Scope)
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// sqlStateHeld is the SQLSTATE with which effect_claim and
// effect_lease_claim refuse a held key (migration 025).
const sqlStateHeld = "OFH01"

// heldErr translates the claim functions' refusal of a held key; other
// errors are returned as they are.
func heldErr(err error, scope, key string) (error, bool) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == sqlStateHeld {
		return &HeldError{Scope: scope, Key: key}, true
	}
	return err, false
}
