package wire_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/wire"
)

const benchAvroSchema = `{"type":"record","name":"Bench","fields":[{"name":"pad","type":"string"}]}`

// benchEvent is the bench's event: a 256-byte JSON payload, as the relay
// builds it (producer set).
func benchEvent() envelope.Envelope {
	payload := []byte(`{"pad":"` + strings.Repeat("x", 246) + `"}`)
	return envelope.Envelope{EventID: "ev-123456", Source: "src-17", Seq: 42, EventType: "bench.event", Payload: payload, Producer: "db"}
}

// BenchmarkAvroEncode is the relay's per-record encoding cost in avro
// beside json (no registry: the codec is compiled from the schema).
// cpu-ns/op is the process's CPU time per record (getrusage): on a machine
// other work loads, ns/op counts the waits for a core, cpu-ns/op much less.
func BenchmarkAvroEncode(b *testing.B) {
	for _, f := range []wire.Format{wire.FormatJSON, wire.FormatAvro} {
		b.Run(string(f), func(b *testing.B) {
			tf := wire.TopicFormat{Format: f}
			if f == wire.FormatAvro {
				tf.Schema = benchAvroSchema
			}
			enc := wire.NewEncoderForTest(map[string]wire.TopicFormat{"t": tf})
			ev := benchEvent()
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				if _, err := enc.Record(&ev, "t"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The relay builds one record per event on every core: a change that adds
// allocations per record (GC work the publish loop pays for) fails here.
// 13 for an avro record of the bench's event (30 before the encoder read
// JSON in one pass and shared its constant header values), 4 for json
// (10 before the envelope's header values shared one buffer). The race
// detector drops pooled state at random: 15 there, 16 allowed.
func TestRecordAllocations(t *testing.T) {
	for _, tc := range []struct {
		format       wire.Format
		max, maxRace float64
	}{{wire.FormatJSON, 4, 4}, {wire.FormatAvro, 13, 16}} {
		tf := wire.TopicFormat{Format: tc.format}
		if tc.format == wire.FormatAvro {
			tf.Schema = benchAvroSchema
		}
		enc := wire.NewEncoderForTest(map[string]wire.TopicFormat{"t": tf})
		ev := benchEvent()
		got := testing.AllocsPerRun(1000, func() {
			if _, err := enc.Record(&ev, "t"); err != nil {
				t.Fatal(err)
			}
		})
		limit := tc.max
		if raceEnabled {
			limit = tc.maxRace
		}
		if got > limit {
			t.Errorf("%s: %.1f allocations per record, want at most %.0f", tc.format, got, limit)
		}
	}
}
