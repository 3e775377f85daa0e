package itest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/wire"
)

// orderAvro is the avro schema of the relay test's topic.
const orderAvro = `{"type": "record", "name": "Order", "namespace": "shop",
  "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}]}`

// TestRelayPublishesAvro: the relay binary publishes a topic whose topic
// spec says avro. Events enqueued as JSON from Go and from SQL arrive framed
// for the registry (Confluent framing, magic byte 0, the registered schema's
// id), with the contract-version header, and decode back to the JSON that
// was enqueued. A payload that does not fit the schema (amount is text) is
// set aside with the reason schema_mismatch, and only its source waits: the
// other source's later event is published.
func TestRelayPublishesAvro(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newRelayEnv(t, 1)
	registry := testkit.SchemaRegistryURL(t)
	spec := map[string]any{"format": 1, "topics": []map[string]any{
		{"name": e.topic, "role": "events", "partitions": 1, "replication_factor": 1, "min_insync_replicas": 1,
			"retention_ms": 86400000, "cleanup_policy": "delete", "compression": "producer",
			"wire": map[string]any{"format": "avro", "schema": orderAvro, "compatibility": "BACKWARD"}},
		{"name": e.checkpoint, "role": "checkpoint", "partitions": 1, "replication_factor": 1, "min_insync_replicas": 1,
			"retention_ms": -1, "cleanup_policy": "compact", "compression": "producer"},
	}}
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(t.TempDir(), "topics.json")
	if err := os.WriteFile(specFile, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	// Register the schema as `relay topics apply` does (the topics exist).
	reg, err := sr.NewClient(sr.URLs(registry))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wire.Register(ctx, reg, e.topic, wire.TopicFormat{Format: wire.FormatAvro, Schema: orderAvro}, wire.CompatBackward); err != nil {
		t.Fatalf("register: %v", err)
	}
	enqueue := func(source, payload string) {
		t.Helper()
		if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: e.topic, Source: source, EventType: "order.placed", Payload: []byte(payload)})
			return err
		}); err != nil {
			t.Fatalf("enqueue %s: %v", source, err)
		}
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
