// Package seqguard applies each stream's events in seq order on top of the
// inbox's dedup: an event ahead of a gap is parked durably, the gap is
// recorded, parked events apply as soon as the gap fills, and a gap open
// longer than its timeout is given up loudly (recorded, counted, logged)
// rather than skipped silently. docs/seqguard.md describes the behaviour and
// its policies for operators.
//
// The package has two layers.
//
// The decision logic (State, Policy, Step) is pure: no I/O, no database or
// Kafka client, and time is an argument. State.Receive decides what to do
// with a new event, State.Tick gives up expired gaps, and both return the
// new State and an ordered list of Steps (apply, park, hold, gap opened,
// narrowed, filled, given up) for a store to carry out:
//
//	p := seqguard.Policy{}.WithDefaults()       // expect-first-seq-1, deliver-late, 30 s, 1000 parked
//	s, steps, err := s.Receive(seq, now, p)    // s: this source's State
//	s, steps = s.Tick(now)                     // when s.NextDeadline() has passed
//
// A stream (Stream) is what one producer wrote for one topic and source; a
// record without a producer belongs to its source's legacy stream. State,
// parking and gaps are per stream.
//
// PGStore keeps the state in Postgres, inside the consumer's inbox
// transaction: last_applied in onceflow.seq_state (never pruned), parked
// events as onceflow.inbox rows with status 'parked', gaps in
// onceflow.seq_gaps. Per batch, after inserting the inbox rows:
//
//	l, err := store.Lock(ctx, tx, streams, now) // seq_state rows locked in stream order
//	for _, ev := range newEvents {
//		out, err := l.Receive(ctx, ev, now, policyFor(ev.EventType))
//		for _, a := range out.Apply {
//			// run the handler for a.Event (tell it a.Late) in tx, in this order
//		}
//	}
//	// commit; then count out.Steps and log out.GivenUp() at ERROR
//
// A timer in every replica calls PGStore.GiveUpExpired in its own
// transaction; each expired gap is given up exactly once however many
// replicas run it.
//
// Overwrite is the other tool for ordering: a monotonic guard that writes a
// row's newest state only if its seq is newer than the row's.
package seqguard
