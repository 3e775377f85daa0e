package admin

import "errors"

// ErrSetAsideNotFound means no open set-aside entry has that outbox id.
var ErrSetAsideNotFound = errors.New("no open set-aside row with that outbox id")

// ErrRetryDue means the set-aside row is being retried (its retry time has
// come): the relay may be publishing it right now, so it cannot be skipped.
var ErrRetryDue = errors.New("a retry of the row is due or running: wait until it is published or set aside again")
