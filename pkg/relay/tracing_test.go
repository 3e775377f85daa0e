package relay_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/relay"
)

// recordingProvider returns a tracer provider that samples every span and
// keeps the ended ones in memory.
func recordingProvider() (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	sr := tracetest.NewSpanRecorder()
	return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr), sdktrace.WithSampler(sdktrace.AlwaysSample())), sr
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func spansNamed(sr *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// The relay makes one "relay transaction" span per Kafka transaction, in a
// trace of its own, linked to the producer context of each event that has
// one, with the shard, rows, bytes and outcome; the first transaction of a
// new producer carries the recovery (and the fencing of older producers) as
// span events.
func TestRelayTransactionSpan(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	tp, sr := recordingProvider()
	topic := testkit.Topic(t, "unit-trace", 1, nil)
	rb := startRelay(t, topic, func(c *relay.Config) { c.TracerProvider = tp; c.Shard = "s1" })
	b := rb.bundle
	// Three events in one transaction, two of them with a producer trace.
	traced := []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	if err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		for i, src := range []string{"a", "b", "c"} {
			m := outbox.Message{Topic: topic, Source: src, EventType: "t", EventID: "ev-" + src, Payload: []byte(`{"n":1}`)}
			if i < 2 {
				m.Traceparent = traced[i]
			}
			if _, err := (outbox.Writer{TracerProvider: noop.NewTracerProvider()}).Enqueue(b.ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the batch published", func() bool {
		var n int
		_ = rb.db.Pool.QueryRow(rb.ctx, `SELECT count(*) FROM onceflow.outbox WHERE id NOT IN (SELECT id FROM onceflow.outbox_pending)`).Scan(&n)
		return n == 3 && len(spansNamed(sr, "relay transaction")) > 0
	})
	s := spansNamed(sr, "relay transaction")[0]
	if s.Parent().IsValid() {
		t.Errorf("relay transaction has a parent %v, want a new trace", s.Parent())
	}
	a := attrs(s)
	if a["onceflow.shard"].AsString() != "s1" || a["onceflow.rows"].AsInt64() != 3 || a["onceflow.bytes"].AsInt64() < 21 ||
		a["onceflow.outcome"].AsString() != "committed" || a["messaging.operation.type"].AsString() != "send" {
		t.Errorf("attributes %v", s.Attributes())
	}
	links := map[string]string{}
	for _, l := range s.Links() {
		for _, kv := range l.Attributes {
			if kv.Key == "messaging.message.id" {
				links[fmt.Sprintf("00-%s-%s-01", l.SpanContext.TraceID(), l.SpanContext.SpanID())] = kv.Value.AsString()
			}
		}
	}
	if len(links) != 2 || links[traced[0]] != "ev-a" || links[traced[1]] != "ev-b" {
		t.Errorf("links %v, want one per traced event", links)
	}
	events := map[string]bool{}
	for _, e := range s.Events() {
		events[e.Name] = true
	}
	if !events["recovered from checkpoint"] || !events["producer initialised: older producers of the transactional.id are fenced"] {
		t.Errorf("first transaction's events %v, want the recovery and the fencing of older producers", s.Events())
	}
}
