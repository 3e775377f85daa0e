package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A transaction that does not commit says why in onceflow.outcome, with an
// event for fencing, a lost lease and an unknown commit outcome.
func TestTxnSpanOutcomes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err     error
		outcome string
		event   string
	}{
		{nil, outcomeCommitted, ""},
		{fmt.Errorf("%w: commit: %w", errUnknownOutcome, kerr.ProducerFenced), outcomeFenced, "fenced: a newer producer with this transactional.id took over"},
		{fmt.Errorf("produce to %q: %w", "t", kerr.InvalidProducerEpoch), outcomeFenced, "fenced: a newer producer with this transactional.id took over"},
		{ErrLeadershipLost, outcomeLeaseLost, "lease lost: not committing; a standby takes over"},
		{fmt.Errorf("%w: commit: %w", errUnknownOutcome, context.DeadlineExceeded), outcomeUnknown, "commit outcome unknown: the next producer recovers from the checkpoint"},
		{&TopicError{Topic: "t", Err: errors.New("unknown topic")}, outcomeAborted, ""},
		{&refusedError{refused: map[int64]refused{1: {reason: "too_large", err: kerr.MessageTooLarge}}}, outcomeRefused,
			"Kafka refused records for good: alone they are tried again, refused alone they are set aside"},
	} {
		sr := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
		r := &publisher{cfg: Config{Shard: "s"}, tracer: tracer(tp), recovered: &recovery{checkpointIDs: 2, marked: 1}}
		r.startTxn(context.Background(), []row{{id: 1, payload: []byte("{}")}}, 0).end(tt.err)
		s := sr.Ended()[0]
		var outcome string
		for _, kv := range s.Attributes() {
			if kv.Key == attrOutcome {
				outcome = kv.Value.AsString()
			}
		}
		names := map[string]bool{}
		for _, e := range s.Events() {
			names[e.Name] = true
		}
		if outcome != tt.outcome || (tt.event != "" && !names[tt.event]) || !names["recovered from checkpoint"] {
			t.Errorf("error %v: outcome %q, events %v; want %q and %q", tt.err, outcome, s.Events(), tt.outcome, tt.event)
		}
		if (tt.err != nil) != (s.Status().Code == codes.Error) {
			t.Errorf("error %v: status %v", tt.err, s.Status())
		}
		if r.recovered != nil {
			t.Errorf("the recovery is reported once, on the next transaction only")
		}
	}
}
