// Package status is the vocabulary of onceflow.inbox's status column: the
// one place its values are named. pkg/inbox owns the table; the sequence
// guard's Postgres store (pkg/seqguard), which parks and holds rows inside
// the inbox transaction, imports this package rather than pkg/inbox (which
// imports it). It imports nothing.
//
// SQL text may spell the values out; Go code uses these constants.
package status

// Status is the state of one inbox row.
type Status string

const (
	// Processed: the event was applied (or, for a duplicate, had been
	// applied before); the handler's writes committed with the row.
	Processed Status = "processed"
	// Parked: the event waits behind a sequence gap of its source; its
	// headers and payload are kept until the gap is filled or given up.
	Parked Status = "parked"
	// Held: the event came after its gap was given up (or conflicts with
	// an applied seq) and waits for an operator (`consumer dlq replay`).
	Held Status = "held"
	// Dead: the handler kept failing or the record was malformed; the row
	// keeps the error, attempts, headers and payload for an operator.
	Dead Status = "dead"
)

// NeedsOperator are the statuses an operator lists and replays.
var NeedsOperator = []Status{Dead, Held}

// Valid reports whether s is one of the four statuses.
func (s Status) Valid() bool {
	switch s {
	case Processed, Parked, Held, Dead:
		return true
	}
	return false
}
