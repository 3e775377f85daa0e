package envelope_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/onceflow/onceflow/pkg/envelope"
)

func TestPayloadSchemas(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"s/order.created.schema.json": {Data: []byte(`{"type":"object","required":["id","total"],
			"properties":{"id":{"type":"string"},"total":{"$ref":"common.defs.json#/$defs/money"}}}`)},
		"s/common.defs.json": {Data: []byte(`{"$defs":{"money":{"type":"integer","minimum":0}}}`)},
		"s/README.md":        {Data: []byte("not a schema")},
	}
	p, err := envelope.LoadPayloadSchemas(fsys, "s")
	if err != nil {
		t.Fatalf("LoadPayloadSchemas: %v", err)
	}
	if got := strings.Join(p.EventTypes(), ","); got != "order.created" {
		t.Fatalf("event types %q", got)
	}
	cases := []struct {
		name, eventType, contentType, payload string
		want                                  string // "" means valid
	}{
		{"conforms", "order.created", "", `{"id":"o-1","total":42,"extra":true}`, ""},
		{"undeclared type passes", "order.shipped", "", `{"anything":1}`, ""},
		{"missing field", "order.created", "", `{"id":"o-1"}`, "total"},
		{"wrong type via $ref", "order.created", "", `{"id":"o-1","total":-1}`, "/total"},
		{"not JSON", "order.created", "", `{"id":`, "not JSON"},
		{"non-JSON content type", "order.created", "text/plain", `hi`, "content type text/plain is not JSON"},
		{"+json content type", "order.created", "application/vnd.x+json", `{"id":"o-1","total":1}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := p.Validate(tc.eventType, tc.contentType, []byte(tc.payload))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var pe *envelope.PayloadError
			if !errors.As(err, &pe) || pe.EventType != tc.eventType || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want a *PayloadError for %s mentioning %q", err, tc.eventType, tc.want)
			}
		})
	}
	var none *envelope.PayloadSchemas
	if err := none.Validate("order.created", "", []byte(`1`)); err != nil {
		t.Fatalf("nil PayloadSchemas should accept everything: %v", err)
	}
}

func TestPayloadSchemasRejectsBadSchema(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{"s/bad.schema.json": {Data: []byte(`{"type":"nonsense"}`)}}
	if _, err := envelope.LoadPayloadSchemas(fsys, "s"); err == nil || !strings.Contains(err.Error(), "bad.schema.json") {
		t.Fatalf("LoadPayloadSchemas = %v, want an error naming bad.schema.json", err)
	}
}

// The example in contract/payloads compiles and means what it says.
func TestPayloadSchemasContractExample(t *testing.T) {
	t.Parallel()
	p, err := envelope.LoadPayloadSchemas(os.DirFS("../../contract"), "payloads")
	if err != nil {
		t.Fatalf("contract/payloads: %v", err)
	}
	if err := p.Validate("example.order_placed", "", []byte(`{"order_id":"o-88","total_cents":4200,"currency":"EUR"}`)); err != nil {
		t.Fatalf("valid example.order_placed rejected: %v", err)
	}
	if err := p.Validate("example.order_placed", "", []byte(`{"order_id":"o-88","total_cents":"42","currency":"EUR"}`)); err == nil {
		t.Fatalf("example.order_placed with a string total accepted")
	}
	// The example governs no name a newcomer would pick for a real event.
	if err := p.Validate("order.created", "", []byte(`1`)); err != nil {
		t.Fatalf("the contract's example governs order.created: %v", err)
	}
}
