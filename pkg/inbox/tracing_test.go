package inbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/onceflow/onceflow/internal/obs"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/seqguard"
)

// traced is a test event's producer context: trace id n, span id n.
func traced(n byte) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0xa, n}, SpanID: trace.SpanID{0xb, n}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
}

func traceparent(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
}

// tracedRec is rec for source src, carrying producer context n.
func tracedRec(src string, seq, offset int64, n byte) *kgo.Record {
	ev := envelope.Envelope{EventID: fmt.Sprintf("%s-%d", src, seq), Source: src, Seq: seq, EventType: "t",
		Payload: []byte(`{}`), Traceparent: traceparent(traced(n)), Headers: map[string]string{"tracestate": "v=1"}}
	r := ev.Record("topic")
	r.Offset = offset
	return r
}

type traceSetup struct {
	applySetup
	sr *tracetest.SpanRecorder
}

// setupTraced is setupApply with a span recorder as the tracer provider.
func setupTraced(t *testing.T) traceSetup {
	t.Helper()
	s := setupApply(t, nil)
	sr := tracetest.NewSpanRecorder()
	s.app.cfg.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	s.app.tr = newTracing(s.app.cfg)
	return traceSetup{applySetup: s, sr: sr}
}

// batch applies recs the way processBatch does: process spans around one
// transaction.
func (s traceSetup) batch(t *testing.T, recs ...*kgo.Record) outcome {
	t.Helper()
	its := items(recs...)
	s.app.tr.startProcess(context.Background(), its)
	out, err := s.app.applyTx(context.Background(), its)
	s.app.tr.endProcess(its, err)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// processSpans are the ended process spans by trace id, in end order.
func (s traceSetup) processSpans() map[trace.TraceID][]sdktrace.ReadOnlySpan {
	out := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	for _, sp := range s.sr.Ended() {
		if sp.Name() == "process topic" {
			out[sp.SpanContext().TraceID()] = append(out[sp.SpanContext().TraceID()], sp)
		}
	}
	return out
}

func outcomes(spans []sdktrace.ReadOnlySpan) string {
	var out []string
	for _, sp := range spans {
		out = append(out, spanAttrs(sp)["onceflow.outcome"].AsString())
	}
	return strings.Join(out, ",")
}

// Every record gets a process span that continues its producer's trace,
// with the messaging attributes and its outcome: applied, duplicate, parked
// then released (a second span in the same trace), dead_lettered (malformed);
// each batch is an "inbox transaction" span the process spans link to.
func TestProcessSpans(t *testing.T) {
	t.Parallel()
	s := setupTraced(t)
	bad := &kgo.Record{Topic: "topic", Offset: 3, Value: []byte(`{}`), Headers: []kgo.RecordHeader{
		{Key: "event-id", Value: []byte("m")}, {Key: "traceparent", Value: []byte(traceparent(traced(9)))}}}
	s.batch(t, tracedRec("s", 1, 0, 1), tracedRec("s", 3, 1, 3), tracedRec("s", 1, 2, 1), bad)
	s.batch(t, tracedRec("s", 2, 4, 2))
	s.batch(t, tracedRec("s", 1, 5, 1))

	got := s.processSpans()
	for n, want := range map[byte]string{1: "applied,duplicate,duplicate", 2: "applied", 3: "parked,released", 9: "dead_lettered"} {
		sc := traced(n)
		spans := got[sc.TraceID()]
		if o := outcomes(spans); o != want {
			t.Errorf("trace %d: outcomes %q, want %q", n, o, want)
		}
		for _, sp := range spans {
			if sp.Parent().SpanID() != sc.SpanID() || sp.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("trace %d: span parent %v kind %v, want the producer's span, consumer", n, sp.Parent(), sp.SpanKind())
			}
			if len(sp.Links()) != 1 {
				t.Errorf("trace %d: %d links, want one to its inbox transaction", n, len(sp.Links()))
			}
		}
	}
	first := spanAttrs(got[traced(1).TraceID()][0])
	for k, want := range map[attribute.Key]any{
		"messaging.system": "kafka", "messaging.operation.type": "process", "messaging.destination.name": "topic",
		"messaging.destination.partition.id": "0", "messaging.kafka.offset": int64(0), "messaging.consumer.group.name": "g",
		"messaging.message.id": "s-1", "onceflow.source": "s", "onceflow.seq": int64(1), "onceflow.consumer": "c1",
	} {
		if v := first[k].AsInterface(); v != want {
			t.Errorf("attribute %s = %v, want %v", k, v, want)
		}
	}
	if ts := got[traced(1).TraceID()][0].Parent().TraceState().Get("v"); ts != "1" {
		t.Errorf("tracestate not extracted: %q", ts)
	}
	parked := got[traced(3).TraceID()][0]
	var guardEvents []string
	for _, e := range parked.Events() {
		guardEvents = append(guardEvents, e.Name)
	}
	if fmt.Sprint(guardEvents) != "[sequence guard: gap-opened]" {
		t.Errorf("parked span events %v, want the gap it opened", guardEvents)
	}
	released := got[traced(3).TraceID()][1]
	if len(released.Events()) != 1 || released.Events()[0].Name != "released from parking: gap 2-2 filled" {
		t.Errorf("released span events %v", released.Events())
	}
	var txs []sdktrace.ReadOnlySpan
	for _, sp := range s.sr.Ended() {
		if sp.Name() == "inbox transaction" {
			txs = append(txs, sp)
		}
	}
	if len(txs) != 3 || txs[0].Parent().IsValid() {
		t.Fatalf("%d inbox transaction spans, want 3 in traces of their own", len(txs))
	}
	a := spanAttrs(txs[0])
	if a["onceflow.applied"].AsInt64() != 1 || a["onceflow.duplicates"].AsInt64() != 1 || a["onceflow.parked"].AsInt64() != 1 ||
		a["onceflow.dead_lettered"].AsInt64() != 1 || a["messaging.batch.message_count"].AsInt64() != 4 || a["db.system.name"].AsString() != "postgresql" {
		t.Errorf("first transaction's attributes %v", txs[0].Attributes())
	}
	if l := got[traced(1).TraceID()][0].Links()[0].SpanContext; l.SpanID() != txs[0].SpanContext().SpanID() {
		t.Errorf("process span links to %v, want its transaction %v", l, txs[0].SpanContext())
	}
}

// A gap given up by the timer: the gap timer transaction span has a "sequence
// gap given up" event with the trace ids of the events that waited behind
// it, the gap row and the ERROR line record them, and the released event's
// trace shows parked then released. An event of the given-up range that
// arrives later is late (deliver-late) or held (hold).
func TestGapGiveUpTraces(t *testing.T) {
	t.Parallel()
	s := setupTraced(t)
	ctx := context.Background()
	s.batch(t, tracedRec("t", 2, 0, 2), tracedRec("t", 3, 1, 3), tracedRec("u", 2, 2, 4))
	g := s.app.guard.(*seqGuard)
	out, err := s.app.giveUpExpired(ctx, g, time.Now().Add(time.Hour), nil)
	if err != nil || len(out.guard.givenUp) != 2 {
		t.Fatalf("give up: %+v %v", out, err)
	}
	s.batch(t, tracedRec("t", 1, 3, 1))
	s.app.cfg.LatePolicy = seqguard.Hold
	s.batch(t, tracedRec("u", 1, 4, 5))

	want := []string{traced(2).TraceID().String(), traced(3).TraceID().String()}
	var ids []string
	if err := s.db.Pool.QueryRow(ctx, `SELECT trace_ids FROM onceflow.seq_gaps WHERE source = 't' AND state = 'given_up'`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Errorf("gap row's trace_ids %v, want %v", ids, want)
	}
	var timer sdktrace.ReadOnlySpan
	for _, sp := range s.sr.Ended() {
		if sp.Name() == "gap timer transaction" {
			timer = sp
		}
	}
	if timer == nil {
		t.Fatal("no gap timer transaction span")
	}
	var evAttrs map[attribute.Key]attribute.Value
	for _, e := range timer.Events() {
		if e.Name == "sequence gap given up" {
			m := map[attribute.Key]attribute.Value{}
			for _, kv := range e.Attributes {
				m[kv.Key] = kv.Value
			}
			if m["onceflow.source"].AsString() == "t" {
				evAttrs = m
			}
		}
	}
	if evAttrs == nil || fmt.Sprint(evAttrs["onceflow.trace_ids"].AsStringSlice()) != fmt.Sprint(want) || evAttrs["onceflow.gap"].AsString() != "1-1" {
		t.Errorf("gap timer span events %v", timer.Events())
	}

	var logs bytes.Buffer
	c := &Consumer{log: slog.New(obs.TraceHandler(slog.NewJSONHandler(&logs, nil)))}
	c.logGivenUp(ctx, out.guard.givenUp, out.deadReleased)
	if !strings.Contains(logs.String(), `"trace_ids":["`+want[0]+`","`+want[1]+`"]`) {
		t.Errorf("given-up ERROR line without the trace ids: %s", logs.String())
	}
	if !strings.Contains(logs.String(), `"trace_id":"`+timer.SpanContext().TraceID().String()+`"`) {
		t.Errorf("given-up ERROR line without the gap timer transaction's trace_id: %s", logs.String())
	}

	got := s.processSpans()
	for n, want := range map[byte]string{2: "parked,released", 3: "parked,released", 1: "late", 5: "held"} {
		if o := outcomes(got[traced(n).TraceID()]); o != want {
			t.Errorf("trace %d: outcomes %q, want %q", n, o, want)
		}
	}
	rel := got[traced(2).TraceID()][1]
	if len(rel.Links()) != 1 || rel.Links()[0].SpanContext.SpanID() != timer.SpanContext().SpanID() {
		t.Errorf("released span links %v, want the gap timer transaction", rel.Links())
	}
}

// A handler failure is an event on the process span per try; the dead
// letter ends it dead_lettered, and the dead-letter ERROR line carries the
// event's trace id (the producer's, as the row's kept headers do).
func TestDeadLetterTraces(t *testing.T) {
	t.Parallel()
	s := setupTraced(t)
	s.app.cfg.RetryMaxAttempts = 2
	s.app.cfg.RetryInitialInterval, s.app.cfg.RetryMaxInterval = 1, 1
	var logs syncBuf
	s.app.cfg.Logger = slog.New(obs.TraceHandler(slog.NewJSONHandler(&logs, nil)))
	s.app.handler = asBatch(HandlerFunc(func(context.Context, pgx.Tx, Event) error { return errors.New("nope") }))
	its := items(tracedRec("d", 1, 0, 7))
	s.app.tr.startProcess(context.Background(), its)
	out, err := s.app.applyIsolated(context.Background(), its, nil, func(error) {})
	s.app.tr.endProcess(its, err)
	if err != nil || out.dead != 1 {
		t.Fatalf("%+v %v", out, err)
	}
	spans := s.processSpans()[traced(7).TraceID()]
	if o := outcomes(spans); o != "dead_lettered" {
		t.Fatalf("outcomes %q", o)
	}
	var tries int
	for _, e := range spans[0].Events() {
		if e.Name == "handler failed" {
			tries++
		}
	}
	if tries != 2 {
		t.Errorf("%d handler failed events, want 2", tries)
	}
	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "event dead-lettered") {
			_ = json.Unmarshal([]byte(l), &line)
		}
	}
	if line["trace_id"] != traced(7).TraceID().String() || line["span_id"] != spans[0].SpanContext().SpanID().String() {
		t.Errorf("dead-letter line %v, want the event's trace_id and its process span_id", line)
	}
	var kept string
	if err := s.db.Pool.QueryRow(context.Background(), `SELECT headers->>'traceparent' FROM onceflow.inbox WHERE event_id = 'd-1'`).Scan(&kept); err != nil || kept != traceparent(traced(7)) {
		t.Errorf("dead row keeps traceparent %q (%v)", kept, err)
	}
	dl, err := ListDeadLetters(context.Background(), s.db.Pool, "c1", 10)
	if err != nil || len(dl) != 1 || dl[0].TraceID != traced(7).TraceID().String() {
		t.Errorf("ListDeadLetters = %+v, %v; want the trace id", dl, err)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// An event whose inbox row was pruned and that comes again is recognised by
// the sequence guard as applied in order: its span says duplicate.
func TestPrunedRedeliverySpanIsDuplicate(t *testing.T) {
	t.Parallel()
	s := setupTraced(t)
	s.batch(t, tracedRec("p", 1, 0, 1), tracedRec("p", 2, 1, 2))
	if _, err := s.db.Pool.Exec(context.Background(), `DELETE FROM onceflow.inbox WHERE event_id = 'p-1'`); err != nil {
		t.Fatal(err)
	}
	s.batch(t, tracedRec("p", 1, 2, 1))
	if o := outcomes(s.processSpans()[traced(1).TraceID()]); o != "applied,duplicate" {
		t.Errorf("outcomes %q, want applied,duplicate", o)
	}
}
