package wire_test

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/wire"
)

// BenchmarkAvroEncode is the relay's per-record encoding cost in avro
// beside json (no registry: the codec is compiled from the schema).
func BenchmarkAvroEncode(b *testing.B) {
	enc := wire.NewEncoderForTest(map[string]wire.TopicFormat{"t": {Format: wire.FormatAvro,
		Schema: `{"type":"record","name":"Bench","fields":[{"name":"pad","type":"string"}]}`}})
	payload := []byte(`{"pad":"` + strings.Repeat("x", 246) + `"}`)
	ev := envelope.Envelope{EventID: "e", Source: "s", Seq: 1, EventType: "t", Payload: payload}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := enc.Record(&ev, "t"); err != nil {
			b.Fatal(err)
		}
	}
}
