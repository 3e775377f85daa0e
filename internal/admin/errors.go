package admin

import (
	"errors"
	"fmt"
)

// BadRequest is a request the service refuses as given (HTTP 400, exit
// status 2 in the CLI); Err names what is wrong.
type BadRequest struct{ Err error }

func (e *BadRequest) Error() string { return e.Err.Error() }
func (e *BadRequest) Unwrap() error { return e.Err }

func badRequest(format string, a ...any) error { return &BadRequest{Err: fmt.Errorf(format, a...)} }

// ErrRequestIDReused: a request id came back with a different request (HTTP
// 422). Request ids name one change; a new change needs a new id.
var ErrRequestIDReused = errors.New("admin: request id already used for a different request")

// CountChanged: the request's expected match count is not what matches now
// (HTTP 409); the operator should look again before replaying.
type CountChanged struct {
	Expected, Matched int
}

func (e *CountChanged) Error() string {
	return fmt.Sprintf("%d events match now, not the %d expected: look at them again before replaying", e.Matched, e.Expected)
}
