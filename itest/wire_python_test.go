package itest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/wire"
)

const wireProto = `syntax = "proto3";
package shop;
message Order { string id = 1; int32 qty = 2; }`

// protoDescriptor is wireProto's FileDescriptorProto, serialized and base64,
// for the Python reader (which has no protoc to compile .proto text).
func protoDescriptor(t *testing.T) string {
	t.Helper()
	comp := protocompile.Compiler{Resolver: &protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"order.proto": wireProto})}}
	files, err := comp.Compile(context.Background(), "order.proto")
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(protodesc.ToFileDescriptorProto(files[0]))
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// wireOrdersHandler is the Go consumer's handler in
// TestWireFormatsReadByThirdPartyClients: it keeps each event's JSON view.
const wireOrdersHandler = `INSERT INTO public.orders (event_id, topic, source, seq, payload)
VALUES (:event_id, :topic, :source, :seq, :payload::jsonb)`

// rawSeen is a BatchHandler that checks each event's Raw record (the
// record as fetched, before the JSON view) before handing the events on to
// h: framed with the topic's registered schema id (ids) in a registered
// format, else a structured CloudEvent.
type rawSeen struct {
	h    inbox.BatchHandler
	ids  map[string]int
	mu   sync.Mutex
	seen map[string]bool
	bad  map[string]string
}

func (r *rawSeen) HandleBatch(ctx context.Context, tx pgx.Tx, evs []inbox.Event) error {
	r.mu.Lock()
	for _, ev := range evs {
		r.seen[ev.EventID] = true
		switch id, framed := r.ids[ev.Topic]; {
		case ev.Raw == nil:
			r.bad[ev.EventID] = "no raw record"
		case framed:
			var h sr.ConfluentHeader
			if got, _, err := h.DecodeID(ev.Raw.Value); err != nil || got != id {
				r.bad[ev.EventID] = fmt.Sprintf("raw value not framed with schema id %d: % x", id, ev.Raw.Value[:min(len(ev.Raw.Value), 6)])
			}
		default:
			var ct string
			for _, hd := range ev.Raw.Headers {
				if hd.Key == "content-type" {
					ct = string(hd.Value)
				}
			}
			if ct != "application/cloudevents+json" {
				r.bad[ev.EventID] = "raw content-type " + ct
			}
		}
	}
	r.mu.Unlock()
	return r.h.HandleBatch(ctx, tx, evs)
}

// TestWireFormatsReadByThirdPartyClients: events enqueued as JSON through
// each enqueue path — Go (outbox.Enqueue), SQL (onceflow.enqueue) and the
// Python package (onceflow.enqueue in Python) — are published by the relay
// binary to topics in avro (as binary CloudEvents), protobuf, json-schema
// and json as structured CloudEvents, and read by Python clients that know
// nothing of onceflow: confluent-kafka's Avro/Protobuf/JSON Schema
// deserializers against the registry and the CloudEvents SDK's Kafka
// binding. Each sees every event once, with its payload, its identity and
// the contract version. The Go consumer (through the registry) applies
// each event once, its SQL handler reading the JSON that was enqueued, and
// a Go handler finds each event's record as the relay wrote it (Event.Raw).
func TestWireFormatsReadByThirdPartyClients(t *testing.T) {
	t.Parallel()
	py, pyWire := testkit.Python(t), testkit.PythonWire(t) // may build the venvs first
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newRelayEnv(t, 1)
	brokers, registry := testkit.KafkaBrokers(t), testkit.SchemaRegistryURL(t)
	reg, err := sr.NewClient(sr.URLs(registry))
	if err != nil {
		t.Fatal(err)
	}
	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// n events per enqueue path and topic.
	const n = 2
	paths := []string{"go", "sql", "py"}
	cases := []struct {
		mode  string
		tf    wire.TopicFormat
		args  []string
		topic string
	}{
		{mode: "ce-binary-avro", tf: wire.TopicFormat{Format: wire.FormatAvro, CloudEvents: wire.CloudEventsBinary,
			Schema: `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`}},
		{mode: "protobuf", tf: wire.TopicFormat{Format: wire.FormatProtobuf, Schema: wireProto}, args: []string{protoDescriptor(t), "shop.Order"}},
		{mode: "json-schema", tf: wire.TopicFormat{Format: wire.FormatJSONSchema,
			Schema: `{"type":"object","required":["id","qty"],"properties":{"id":{"type":"string"},"qty":{"type":"integer"}}}`}},
		{mode: "ce-structured", tf: wire.TopicFormat{CloudEvents: wire.CloudEventsStructured}},
	}
	formats := map[string]wire.TopicFormat{}
	var names []string
	for i := range cases {
		cases[i].topic = testkit.Topic(t, "py-"+cases[i].mode, 1, nil)
		formats[cases[i].topic] = cases[i].tf
		names = append(names, cases[i].topic)
	}
	spec, ids := e.wireSpec(ctx, reg, formats)

	// The events: n per path and topic, each path its own source (so its
	// own stream, seq 1..n), payload {"id": "<path>-<i>", "qty": 10*i}.
	eventID := func(mode, path string, i int) string { return fmt.Sprintf("%s-%s-%d", mode, path, i) }
	payload := func(path string, i int) map[string]any {
		return map[string]any{"id": fmt.Sprintf("%s-%d", path, i), "qty": float64(10 * i)}
	}
	var pyEvents []map[string]any
	for _, tc := range cases {
		for i := 1; i <= n; i++ {
			raw, err := json.Marshal(payload("go", i))
			if err != nil {
				t.Fatal(err)
			}
			if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: tc.topic, Source: "go", EventType: "order.placed",
					EventID: eventID(tc.mode, "go", i), Payload: raw})
				return err
			}); err != nil {
				t.Fatalf("go enqueue: %v", err)
			}
			raw, err = json.Marshal(payload("sql", i))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.db.Pool.Exec(ctx, `SELECT onceflow.enqueue($1, 'sql', 'order.placed', $2::jsonb, $3)`,
				tc.topic, string(raw), eventID(tc.mode, "sql", i)); err != nil {
				t.Fatalf("sql enqueue: %v", err)
			}
			pyEvents = append(pyEvents, map[string]any{"topic": tc.topic, "source": "py", "event_type": "order.placed",
				"payload": payload("py", i), "event_id": eventID(tc.mode, "py", i)})
		}
	}
	raw, err := json.Marshal(pyEvents)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "pyinterop.py"), "enqueue", string(raw))
	cmd.Env = append(os.Environ(), "ONCEFLOW_DATABASE_URL="+e.db.URL)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("python enqueue: %v\n%s", err, out)
	}

	relay := e.start("relay", nil, "-topics-spec", spec, "-schema-registry-url", registry)
	start := time.Now()
	for _, topic := range names {
		if err := testkit.WaitDrained(ctx, e.db.Pool, topic); err != nil {
			t.Fatalf("%s: %v\n%s", topic, err, relay.Output())
		}
	}
	t.Logf("the relay published %d events to %d topics in %v", len(paths)*n*len(cases), len(cases), time.Since(start).Round(time.Millisecond))

	// The readers run side by side, each in a subtest started from its own
	// goroutine: not t.Parallel, whose subtests wait for a free slot of
	// -parallel after this function returns.
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		t.Run("go-consumer", func(t *testing.T) {
			start := time.Now()
			if _, err := e.db.Pool.Exec(ctx, `CREATE TABLE public.orders (event_id text PRIMARY KEY, topic text NOT NULL,
			source text NOT NULL, seq bigint NOT NULL, payload jsonb NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			hf := filepath.Join(t.TempDir(), "handlers.json")
			if err := os.WriteFile(hf, fmt.Appendf(nil, `{"handlers": [{"event_type": "*", "kind": "sql", "sql": %q}]}`, wireOrdersHandler), 0o600); err != nil {
				t.Fatal(err)
			}
			h, err := handlerfile.Load(hf)
			if err != nil {
				t.Fatal(err)
			}
			total := len(paths) * n * len(cases)
			raw := &rawSeen{h: h, ids: ids, seen: map[string]bool{}, bad: map[string]string{}}
			c := startEngine(t, inbox.Config{Pool: e.db.Pool, Group: "g-" + e.topic, Topics: names, BatchHandler: raw, SchemaRegistry: reg})
			eventually(t, 60*time.Second, "every event applied", func() (bool, string) {
				p, m := c.metric("onceflow_consumer_processed_total"), c.metric("onceflow_consumer_malformed_total")
				return p == float64(total), fmtState("processed ", p, " malformed ", m)
			})
			c.stop(t)
			rows, err := e.db.Pool.Query(ctx, `SELECT event_id, topic, source, seq, payload FROM public.orders`)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for rows.Next() {
				var id, topic, source string
				var seq int64
				var p map[string]any
				if err := rows.Scan(&id, &topic, &source, &seq, &p); err != nil {
					t.Fatal(err)
				}
				got[id] = fmt.Sprint(topic, " ", source, " ", seq, " ", p)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{}
			for _, tc := range cases {
				for _, path := range paths {
					for i := 1; i <= n; i++ {
						want[eventID(tc.mode, path, i)] = fmt.Sprint(tc.topic, " ", path, " ", i, " ", payload(path, i))
					}
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("applied\n%v\nwant\n%v", got, want)
			}
			raw.mu.Lock()
			defer raw.mu.Unlock()
			if len(raw.seen) != total || len(raw.bad) > 0 {
				t.Fatalf("the handler saw %d events' raw records, want %d; not as the relay wrote them: %v", len(raw.seen), total, raw.bad)
			}
			t.Logf("the Go consumer applied %d events from %d wire formats once each in %v", total, len(cases), time.Since(start).Round(time.Millisecond))
		})
	})
	for _, tc := range cases {
		wg.Go(func() {
			t.Run(tc.mode, func(t *testing.T) {
				start := time.Now()
				args := append([]string{filepath.Join(root, "itest", "testdata", "wire", "read.py"), brokers, registry, tc.topic, tc.mode, fmt.Sprint(len(paths) * n)}, tc.args...)
				cmd := exec.CommandContext(ctx, pyWire, args...)
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("read.py %s: %v\n%s", tc.mode, err, stderr.String())
				}
				got := map[string]int{}
				sc := bufio.NewScanner(bytes.NewReader(out))
				for sc.Scan() {
					var line map[string]any
					if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
						t.Fatalf("read.py line %q: %v", sc.Text(), err)
					}
					hs, _ := line["headers"].(map[string]any)
					if hs["contract-version"] != wire.ContractVersion {
						t.Errorf("contract-version %v in %v", hs["contract-version"], line)
					}
					var id, source, seq string
					if ce, ok := line["ce"].(map[string]any); ok {
						id, _ = ce["id"].(string)
						source, _ = ce["source"].(string)
						seq, _ = ce["sequence"].(string)
					} else {
						id, _ = hs["event-id"].(string)
						source, _ = hs["source"].(string)
						seq, _ = hs["seq"].(string)
					}
					got[id]++
					path, k, _ := strings.Cut(strings.TrimPrefix(id, tc.mode+"-"), "-")
					i, err := strconv.Atoi(k)
					if err != nil {
						t.Errorf("record with event id %q, not one the test enqueued", id)
						continue
					}
					wantSeq := fmt.Sprint(i)
					if line["ce"] != nil {
						wantSeq = wire.FormatSequence(int64(i))
					}
					if source != path || seq != wantSeq || !reflect.DeepEqual(line["value"], payload(path, i)) {
						t.Errorf("record %s: source %q seq %q value %v, want source %q seq %s value %v", id, source, seq, line["value"], path, wantSeq, payload(path, i))
					}
				}
				for _, path := range paths {
					for i := 1; i <= n; i++ {
						if id := eventID(tc.mode, path, i); got[id] != 1 {
							t.Errorf("event %s read %d times, want once", id, got[id])
						}
					}
				}
				t.Logf("%s: %d records read by the third-party client in %v", tc.mode, len(got), time.Since(start).Round(time.Millisecond))
			})
		})
	}
}
