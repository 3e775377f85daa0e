package topics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/wire"
)

const orderV1 = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`

// orderV2 adds a field without a default: not BACKWARD-compatible (a
// reader with v2 cannot read v1 records).
const orderV2 = `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"},{"name":"currency","type":"string"}]}`

func writeSpec(t *testing.T, dir, schema string, names ...string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "order.avsc"), []byte(schema), 0o600); err != nil {
		t.Fatal(err)
	}
	var entries []string
	for i, n := range names {
		w := `,"wire":{"format":"avro","schema_file":"order.avsc","compatibility":"BACKWARD","cloudevents":"binary"}`
		if i > 0 {
			w = ""
		}
		entries = append(entries, fmt.Sprintf(`{"name":%q,"role":"events","partitions":1,"replication_factor":1,"min_insync_replicas":1,
 "retention_ms":3600000,"cleanup_policy":"delete","compression":"producer"%s}`, n, w))
	}
	p := filepath.Join(dir, "topics.json")
	if err := os.WriteFile(p, []byte(`{"format":1,"topics":[`+strings.Join(entries, ",")+`]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestApplyRefusesIncompatibleSchema: `topics apply` registers an avro
// topic's schema with its compatibility level, verify then passes; an
// incompatible schema change is refused before apply creates or alters any
// topic (the spec's second, new topic stays missing), and verify reports the
// unregistered schema.
func TestApplyRefusesIncompatibleSchema(t *testing.T) {
	ctx := context.Background()
	brokers, registry := testkit.KafkaBrokers(t), testkit.SchemaRegistryURL(t)
	suffix := time.Now().UnixNano()
	events, other := fmt.Sprintf("wire-apply-%d", suffix), fmt.Sprintf("wire-apply-other-%d", suffix)
	dir := t.TempDir()
	run := func(sub, spec string) (string, error) {
		var out bytes.Buffer
		err := Command(ctx, "relay", []string{sub, "-kafka-brokers", brokers, "-topics-spec", spec, "-schema-registry-url", registry, "-topics-timeout", "30s"}, &out, nil)
		return out.String(), err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	t.Cleanup(func() { _, _ = adm.DeleteTopics(context.Background(), events, other) })

	spec := writeSpec(t, dir, orderV1, events)
	if out, err := run("apply", spec); err != nil || !strings.Contains(out, "registered: subject \""+events+"-value\"") {
		t.Fatalf("apply v1: %v\n%s", err, out)
	}
	if out, err := run("verify", spec); err != nil {
		t.Fatalf("verify after apply: %v\n%s", err, out)
	}
	// The relay's encoder for the spec: avro + binary CloudEvents.
	reg, err := sr.NewClient(sr.URLs(registry))
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(spec)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := Encoder(ctx, reg, loaded)
	if err != nil {
		t.Fatalf("Encoder after apply: %v", err)
	}
	if tf := enc.Format(events); tf.Format != wire.FormatAvro || tf.CloudEvents != wire.CloudEventsBinary {
		t.Fatalf("encoder format of %s = %+v", events, tf)
	}
	if _, err := Encoder(ctx, nil, loaded); err == nil {
		t.Fatal("Encoder without a registry for an avro spec passed")
	}
	if err := Command(ctx, "relay", []string{"apply", "-kafka-brokers", brokers, "-topics-spec", spec}, &bytes.Buffer{}, nil); err == nil || !strings.Contains(err.Error(), "-schema-registry-url") {
		t.Fatalf("apply without a registry URL = %v, want a usage error naming -schema-registry-url", err)
	}

	spec = writeSpec(t, dir, orderV2, events, other)
	out, err := run("apply", spec)
	var ie *wire.IncompatibleError
	if !errors.As(err, &ie) {
		t.Fatalf("apply v2 = %v, want *wire.IncompatibleError\n%s", err, out)
	}
	if td, err := adm.ListTopics(ctx, other); err != nil || td.Has(other) {
		t.Fatalf("topic %s exists after a refused schema change (err %v): apply must stop before creating topics", other, err)
	}
	out, err = run("verify", spec)
	var de *DriftError
	if !errors.As(err, &de) || !strings.Contains(out, "not registered") {
		t.Fatalf("verify v2 = %v, want drift naming the unregistered schema\n%s", err, out)
	}
}
