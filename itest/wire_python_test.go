package itest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"

	"github.com/onceflow/onceflow/internal/testkit"
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

// TestWireFormatsReadByThirdPartyClients: events encoded as the relay
// encodes them (pkg/wire) in avro (as binary CloudEvents), protobuf,
// json-schema and structured CloudEvents are read by Python clients that
// know nothing of onceflow: confluent-kafka's Avro/Protobuf/JSON Schema
// deserializers against the registry and the CloudEvents SDK's Kafka
// binding. Each sees every event once, with its payload, its identity and
// the contract version.
func TestWireFormatsReadByThirdPartyClients(t *testing.T) {
	ctx := context.Background()
	py := testkit.PythonWire(t)
	brokers, registry := testkit.KafkaBrokers(t), testkit.SchemaRegistryURL(t)
	reg, err := sr.NewClient(sr.URLs(registry))
	if err != nil {
		t.Fatal(err)
	}
	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	cases := []struct {
		mode string
		tf   wire.TopicFormat
		args []string
	}{
		{"ce-binary-avro", wire.TopicFormat{Format: wire.FormatAvro, CloudEvents: wire.CloudEventsBinary,
			Schema: `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`}, nil},
		{"protobuf", wire.TopicFormat{Format: wire.FormatProtobuf, Schema: wireProto}, []string{protoDescriptor(t), "shop.Order"}},
		{"json-schema", wire.TopicFormat{Format: wire.FormatJSONSchema,
			Schema: `{"type":"object","required":["id","qty"],"properties":{"id":{"type":"string"},"qty":{"type":"integer"}}}`}, nil},
		{"ce-structured", wire.TopicFormat{CloudEvents: wire.CloudEventsStructured}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			topic := testkit.Topic(t, "py-"+tc.mode, 1, nil)
			formats := map[string]wire.TopicFormat{topic: tc.tf}
			if tc.tf.Format.Registered() {
				if _, err := wire.Register(ctx, reg, topic, tc.tf, wire.CompatBackward); err != nil {
					t.Fatal(err)
				}
			}
			enc, err := wire.NewEncoder(ctx, reg, formats)
			if err != nil {
				t.Fatal(err)
			}
			var recs []*kgo.Record
			for i := int64(1); i <= n; i++ {
				ev := testEvent("order-9", i)
				ev.Producer = "db-py"
				ev.Payload = fmt.Appendf(nil, `{"id":"o-%d","qty":%d}`, i, i*10)
				rec, err := enc.Record(&ev, topic)
				if err != nil {
					t.Fatal(err)
				}
				recs = append(recs, rec)
			}
			produceRecords(t, testkit.Client(t), recs...)

			args := append([]string{filepath.Join(root, "itest", "testdata", "wire", "read.py"), brokers, registry, topic, tc.mode, fmt.Sprint(n)}, tc.args...)
			cmd := exec.Command(py, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("read.py %s: %v\n%s", tc.mode, err, stderr.String())
			}
			var got []map[string]any
			sc := bufio.NewScanner(bytes.NewReader(out))
			for sc.Scan() {
				var line map[string]any
				if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
					t.Fatalf("read.py line %q: %v", sc.Text(), err)
				}
				got = append(got, line)
			}
			if len(got) != n {
				t.Fatalf("read %d records, want %d:\n%s", len(got), n, out)
			}
			for i, line := range got {
				seq := int64(i + 1)
				want := map[string]any{"id": fmt.Sprintf("o-%d", seq), "qty": float64(seq * 10)}
				if !reflect.DeepEqual(line["value"], want) {
					t.Errorf("record %d: value %v, want %v", i, line["value"], want)
				}
				hs, _ := line["headers"].(map[string]any)
				if hs["contract-version"] != wire.ContractVersion {
					t.Errorf("record %d: contract-version %v", i, hs["contract-version"])
				}
				id := fmt.Sprintf("order-9-%d", seq)
				if ce, ok := line["ce"].(map[string]any); ok {
					if ce["id"] != id || ce["source"] != "order-9" || ce["sequence"] != wire.FormatSequence(seq) {
						t.Errorf("record %d: CloudEvent %v, want id %s sequence %s", i, ce, id, wire.FormatSequence(seq))
					}
				} else if hs["event-id"] != id || hs["seq"] != fmt.Sprint(seq) {
					t.Errorf("record %d: headers %v, want event-id %s seq %d", i, hs, id, seq)
				}
			}
			t.Logf("%s: %d records read by the third-party client in %v", tc.mode, n, time.Since(start).Round(time.Millisecond))
		})
	}
}
