package seqguard

import "errors"

// ErrInvalidSeq is returned for a seq below 1 (seqs start at 1).
var ErrInvalidSeq = errors.New("seqguard: seq must be at least 1")

// ErrGapNotFound is returned by ResolveGap when no unresolved given-up gap of
// the source lies within the range.
var ErrGapNotFound = errors.New("seqguard: no unresolved given-up gap in that range")

// ErrNotLocked is returned when a Locked batch is asked about a source it did
// not lock.
var ErrNotLocked = errors.New("seqguard: source not locked by this batch")

// ErrCorruptState is wrapped by errors that report stored state breaking the
// guard's invariants (for example rows edited by hand).
var ErrCorruptState = errors.New("seqguard: inconsistent stored state")
