package inbox

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/pkg/seqguard"
)

// GapGivenUp describes a sequence gap the consumer gave up: the events
// From–To of Stream never arrived in time, and the events after them were
// applied without them (Config.OnGapGivenUp).
type GapGivenUp struct {
	// Stream is the (producer, topic, source) stream the gap is in.
	Stream seqguard.Stream
	// From and To are the missing seqs, inclusive.
	From, To int64
	// Reason is why the gap was given up (timeout or max_parked).
	Reason seqguard.GiveUpReason
	// OpenedAt is when the gap was opened and Deadline when it was due, on
	// the database's clock.
	OpenedAt, Deadline time.Time
}

// DeadLettered describes an event the consumer dead-lettered
// (Config.OnDeadLetter): its inbox row has status dead, for
// `consumer dlq list` and `dlq replay`.
type DeadLettered struct {
	// EventID is the event's ID (for a malformed record, the key the inbox
	// recorded it under).
	EventID string
	// Stream and Seq identify the event in its stream; for a malformed
	// record they are what could be read from its headers (possibly empty).
	Stream seqguard.Stream
	Seq    int64
	// Topic, Partition and Offset are where the record was read.
	Topic     string
	Partition int32
	Offset    int64
	// Malformed is set when the record could not be decoded; otherwise the
	// handler failed until the retries were exhausted.
	Malformed bool
	// Reason is the decode error or the handler's last error.
	Reason string
}

// LateEvent describes an event that arrived after the gap it belonged to was
// given up (Config.OnLate): its seq is at or below its stream's last
// applied seq.
type LateEvent struct {
	EventID string
	Stream  seqguard.Stream
	Seq     int64
	// Held is set under seqguard.Hold: the event was kept with status held
	// for an operator instead of being delivered to the handler marked late.
	Held bool
}

// notices are what a committed transaction tells the callbacks.
type notices struct {
	late []LateEvent
}

func (n *notices) add(o notices) { n.late = append(n.late, o.late...) }

// notify calls the configured callbacks for what a committed transaction
// did: given-up gaps, dead letters, late events. Never for a rolled-back
// attempt: out is only ever a committed transaction's outcome. A callback
// runs on the calling goroutine (a partition's worker or the gap timer); a
// panic in it is recovered and logged.
func (c *Consumer) notify(ctx context.Context, out *outcome) {
	cfg := &c.cfg
	// A late event is worth a line even without a callback: its stream's
	// order was given up for it.
	for _, l := range out.notes.late {
		what := "delivered to the handler marked late"
		if l.Held {
			what = "held for an operator (consumer dlq list -status held)"
		}
		c.log.WarnContext(ctx, "late event: its seq lies in a gap given up earlier; "+what,
			"event_id", l.EventID, "source", l.Stream.Source, "producer", l.Stream.Producer, "topic", l.Stream.Topic, "seq", l.Seq)
	}
	if cfg.OnGapGivenUp != nil {
		for _, g := range out.guard.givenUp {
			lctx := ctx
			if g.txSpan.IsValid() {
				lctx = trace.ContextWithSpanContext(ctx, g.txSpan)
			}
			info := GapGivenUp{Stream: g.stream, From: g.step.Gap.From, To: g.step.Gap.To, Reason: g.step.Reason,
				OpenedAt: g.step.Gap.OpenedAt, Deadline: g.step.Gap.Deadline}
			c.callback(lctx, "OnGapGivenUp", func() { cfg.OnGapGivenUp(lctx, info) })
		}
	}
	if cfg.OnDeadLetter != nil {
		for _, d := range out.deadItems {
			info := d.info
			c.callback(ctx, "OnDeadLetter", func() { cfg.OnDeadLetter(ctx, info) })
		}
		for _, d := range out.deadReleased {
			info := DeadLettered{EventID: d.EventID, Stream: d.stream(), Seq: d.Seq, Topic: d.Topic,
				Partition: d.Partition, Offset: d.Offset, Reason: d.reason}
			ectx := EventContext(ctx, d.Event)
			c.callback(ectx, "OnDeadLetter", func() { cfg.OnDeadLetter(ectx, info) })
		}
	}
	if cfg.OnLate != nil {
		for _, l := range out.notes.late {
			info := l
			c.callback(ctx, "OnLate", func() { cfg.OnLate(ctx, info) })
		}
	}
}

// callback runs f, recovering and logging a panic so that a broken callback
// cannot stop the consumer.
func (c *Consumer) callback(ctx context.Context, name string, f func()) {
	defer func() {
		if r := recover(); r != nil {
			c.log.ErrorContext(ctx, "callback panicked (recovered; the consumer goes on)", "callback", name, "panic", fmt.Sprint(r))
		}
	}()
	f()
}

// deadInfo describes the dead-lettered item it.
func deadInfo(it *item, reason string) DeadLettered {
	d := DeadLettered{EventID: it.key, Topic: it.rec.Topic, Partition: it.rec.Partition, Offset: it.rec.Offset,
		Malformed: it.bad != nil, Reason: reason}
	if it.bad == nil {
		d.Stream, d.Seq = it.ev.stream(), it.ev.Seq
	}
	return d
}

// lateNotices are the late events among what the guard decided for ev.
func lateNotices(ev *Event, apply []Event, raw []seqguard.Step) []LateEvent {
	var out []LateEvent
	for _, a := range apply {
		if a.Late {
			out = append(out, LateEvent{EventID: a.EventID, Stream: a.stream(), Seq: a.Seq})
		}
	}
	if ev != nil {
		for _, st := range raw {
			if st.Kind == seqguard.StepHold {
				out = append(out, LateEvent{EventID: ev.EventID, Stream: ev.stream(), Seq: ev.Seq, Held: true})
			}
		}
	}
	return out
}
