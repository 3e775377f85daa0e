package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/wire"
)

// A batch large enough to be encoded on several cores gives each row its
// own record, in order, and each misfit its own error at its own index:
// the same as encoding the rows one by one (run with -race).
func TestEncodeRecordsParallelKeepsOrder(t *testing.T) {
	// The registry answers a schema lookup with id 7 (all the encoder asks).
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		fmt.Fprint(w, `{"subject":"orders-value","version":1,"id":7,"schema":"{}"}`)
	}))
	defer srv.Close()
	cl, err := sr.NewClient(sr.URLs(srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	schema := `{"type":"record","name":"Order","fields":[{"name":"n","type":"long"}]}`
	enc, err := wire.NewEncoder(context.Background(), cl, map[string]wire.TopicFormat{"orders": {Format: wire.FormatAvro, Schema: schema}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3*parallelEncodeMin + 17
	rows := make([]row, n)
	envs := make([]envelope.Envelope, n)
	for i := range rows {
		topic, payload := "orders", fmt.Sprintf(`{"n":%d}`, i)
		switch {
		case i%7 == 3:
			topic = "plain" // a json topic in the same batch
		case i%11 == 5:
			payload = `{"n":"not a number"}` // a misfit
		}
		rows[i] = row{id: int64(i), eventID: fmt.Sprint("e", i), topic: topic, source: "s", seq: int64(i + 1)}
		envs[i] = envelope.Envelope{EventID: rows[i].eventID, Source: "s", Seq: int64(i + 1), EventType: "t", Payload: []byte(payload)}
	}
	out, errs := encodeRecords(enc, rows, envs)
	for i := range rows {
		want, wantErr := enc.Record(&envs[i], rows[i].topic)
		var pe *wire.PayloadError
		switch {
		case wantErr != nil:
			if !errors.As(errs[i], &pe) || out[i] != nil {
				t.Fatalf("row %d: %v, %v; want the misfit's PayloadError (%v)", i, out[i], errs[i], wantErr)
			}
		case errs[i] != nil || out[i] == nil:
			t.Fatalf("row %d: %v, want a record", i, errs[i])
		case out[i].Topic != rows[i].topic || string(out[i].Value) != string(want.Value) || string(out[i].Key) != string(want.Key):
			t.Fatalf("row %d: record of topic %q value %x, want %q %x", i, out[i].Topic, out[i].Value, rows[i].topic, want.Value)
		case rows[i].topic == "orders" && (out[i].Value[0] != 0 || binary.BigEndian.Uint32(out[i].Value[1:5]) != 7):
			t.Fatalf("row %d: value %x is not framed with schema id 7", i, out[i].Value)
		}
	}
}
