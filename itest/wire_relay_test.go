package itest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/internal/topics"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/wire"
)

// orderAvro is the avro schema of the relay test's topic.
const orderAvro = `{"type": "record", "name": "Order", "namespace": "shop",
  "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}]}`

// wireSpec writes a topic spec for the relay env: its checkpoint topic, its
// topic and any other topics in formats (topic name -> wire format, each
// with e's partition count), and registers each registered format's schema
// in reg with compatibility BACKWARD, as `relay topics apply` does (the
// topics exist already). It returns the spec file's path and the schema id
// each registered topic's subject got.
func (e *relayEnv) wireSpec(ctx context.Context, reg *sr.Client, formats map[string]wire.TopicFormat) (string, map[string]int) {
	e.t.Helper()
	formats = maps.Clone(formats)
	ids := map[string]int{}
	spec := topics.Spec{Format: 1, Topics: []topics.TopicSpec{{Name: e.checkpoint, Role: topics.RoleCheckpoint,
		Partitions: 1, ReplicationFactor: 1, MinInsyncReplicas: 1, RetentionMs: -1, CleanupPolicy: "compact", Compression: "producer"}}}
	if _, ok := formats[e.topic]; !ok {
		formats[e.topic] = wire.TopicFormat{}
	}
	for topic, tf := range formats {
		ts := topics.TopicSpec{Name: topic, Role: topics.RoleEvents, Partitions: e.partitions, ReplicationFactor: 1,
			MinInsyncReplicas: 1, RetentionMs: 86400000, CleanupPolicy: "delete", Compression: "producer"}
		if tf.Format.Registered() || tf.CloudEvents != wire.CloudEventsOff {
			ts.Wire = &topics.WireSpec{Format: string(tf.Format), Schema: tf.Schema, Message: tf.Message,
				Compatibility: "BACKWARD", CloudEvents: string(tf.CloudEvents)}
		}
		if tf.Format.Registered() {
			ss, err := wire.Register(ctx, reg, topic, tf, wire.CompatBackward)
			if err != nil {
				e.t.Fatalf("register the schema of topic %s: %v", topic, err)
			}
			ids[topic] = ss.ID
		}
		spec.Topics = append(spec.Topics, ts)
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		e.t.Fatal(err)
	}
	specFile := filepath.Join(e.t.TempDir(), "topics.json")
	if err := os.WriteFile(specFile, raw, 0o600); err != nil {
		e.t.Fatal(err)
	}
	return specFile, ids
}

// framedView is a checker's view of a registered format's records: each
// value must be framed for the registry with schema id and decode (through
// dec, with the schema the registry holds under that id) to the JSON want.
func framedView(dec *wire.Decoder, id int, want string) func(context.Context, *kgo.Record) (*kgo.Record, error) {
	var wantV any
	if err := json.Unmarshal([]byte(want), &wantV); err != nil {
		panic(err)
	}
	return func(ctx context.Context, r *kgo.Record) (*kgo.Record, error) {
		var h sr.ConfluentHeader
		got, _, err := h.DecodeID(r.Value)
		if err != nil || got != id {
			return nil, fmt.Errorf("%s/%d@%d: value not framed with schema id %d (id %d, %v): % x", r.Topic, r.Partition, r.Offset, id, got, err, r.Value[:min(len(r.Value), 8)])
		}
		v, err := dec.View(ctx, r)
		if err != nil {
			return nil, err
		}
		var gotV any
		if err := json.Unmarshal(v.Value, &gotV); err != nil || !reflect.DeepEqual(gotV, wantV) {
			return nil, fmt.Errorf("%s/%d@%d: JSON view %s, want %s (%v)", r.Topic, r.Partition, r.Offset, v.Value, want, err)
		}
		return v, nil
	}
}

// TestRelayPublishesAvro: the relay binary publishes a topic whose topic
// spec says avro. Events enqueued as JSON from Go and from SQL arrive framed
// for the registry (Confluent framing, magic byte 0, the registered schema's
// id), with the contract-version header, and decode back to the JSON that
// was enqueued. A payload that does not fit the schema (amount is text) is
// set aside with the reason schema_mismatch, and only its source waits: the
// other source's later event is published. A Go Writer checking payloads
// with the topic's encoder refuses the misfit at enqueue instead.
func TestRelayPublishesAvro(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newRelayEnv(t, 1)
	registry := testkit.SchemaRegistryURL(t)
	reg, err := sr.NewClient(sr.URLs(registry))
	if err != nil {
		t.Fatal(err)
	}
	specFile, _ := e.wireSpec(ctx, reg, map[string]wire.TopicFormat{e.topic: {Format: wire.FormatAvro, Schema: orderAvro}})
	enqueue := func(source, payload string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: e.topic, Source: source, EventType: "order.placed", Payload: []byte(payload)})
			return err
		}); err != nil {
			t.Fatalf("enqueue %s: %v", source, err)
		}
	}
	// Go can refuse the misfit at enqueue: a Writer checking payloads with
	// the relay's encoder writes nothing and says why.
	enc, err := wire.NewEncoder(ctx, reg, map[string]wire.TopicFormat{e.topic: {Format: wire.FormatAvro, Schema: orderAvro}})
	if err != nil {
		t.Fatal(err)
	}
	checked := outbox.Writer{PayloadCheck: enc.Check}
	err = pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		_, err := checked.Enqueue(ctx, tx, outbox.Message{Topic: e.topic, Source: "checked", EventType: "order.placed", Payload: []byte(`{"id": "o-0", "amount": "lots"}`)})
		return err
	})
	var pe *wire.PayloadError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "amount") {
		t.Fatalf("enqueue of a misfit through a checking Writer = %v, want a *wire.PayloadError naming amount", err)
	}
	if n := count(t, e.db, `SELECT count(*) FROM onceflow.outbox WHERE source = 'checked'`); n != 0 {
		t.Fatalf("the refused misfit wrote %d rows", n)
	}
	enqueue("go", `{"id": "o-1", "amount": 100}`)
	if _, err := e.db.Pool.Exec(ctx, `SELECT onceflow.enqueue($1, 'sql', 'order.placed', '{"id": "o-2", "amount": 250}'::jsonb)`, e.topic); err != nil {
		t.Fatalf("sql enqueue: %v", err)
	}
	enqueue("bad", `{"id": "o-3", "amount": "lots"}`)
	enqueue("bad", `{"id": "o-4", "amount": 7}`)
	relay := e.start("relay", nil, "-topics-spec", specFile, "-schema-registry-url", registry)

	var setAside string
	eventually(t, 60*time.Second, "the misfit set aside", func() (bool, string) {
		err := e.db.Pool.QueryRow(ctx, `SELECT reason FROM onceflow.outbox_set_aside WHERE source = 'bad' AND resolved_at IS NULL`).Scan(&setAside)
		return err == nil, fmtState("set aside: ", setAside, " ", err, "\n", relay.Output())
	})
	if setAside != "schema_mismatch" {
		t.Fatalf("set aside as %q, want schema_mismatch", setAside)
	}
	enqueue("go", `{"id": "o-5", "amount": 1}`)

	cl := testkit.ReadCommittedClient(t, e.topic)
	dec := &wire.Decoder{Registry: reg}
	got := map[string]string{}
	deadline := time.Now().Add(60 * time.Second)
	for len(got) < 3 && time.Now().Before(deadline) {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		fs := cl.PollFetches(pctx)
		pcancel()
		fs.EachRecord(func(r *kgo.Record) {
			if len(r.Value) < 5 || r.Value[0] != 0 {
				t.Errorf("record %d is not framed for the registry: % x", r.Offset, r.Value[:min(len(r.Value), 8)])
			}
			var cv string
			for _, h := range r.Headers {
				if h.Key == wire.HeaderContractVersion {
					cv = string(h.Value)
				}
			}
			if cv != wire.ContractVersion {
				t.Errorf("record %d: contract-version %q, want %q", r.Offset, cv, wire.ContractVersion)
			}
			view, err := dec.View(ctx, r)
			if err != nil {
				t.Fatalf("decode record %d: %v", r.Offset, err)
			}
			var v struct {
				ID     string `json:"id"`
				Amount int64  `json:"amount"`
			}
			if err := json.Unmarshal(view.Value, &v); err != nil {
				t.Fatalf("record %d's JSON view %s: %v", r.Offset, view.Value, err)
			}
			got[string(r.Key)+"/"+v.ID] = fmt.Sprint(v.Amount)
		})
	}
	want := map[string]string{"go/o-1": "100", "sql/o-2": "250", "go/o-5": "1"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("published %v, want %v (bad's events held back)\n%s", got, want, relay.Output())
	}
	if out := relay.Output(); !strings.Contains(out, "schema_mismatch") {
		t.Logf("relay output does not name the reason:\n%s", out)
	}
}
