package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
)

// stdJSON is what the Avro encoder read payloads with before readJSON:
// encoding/json's Decoder with UseNumber.
func stdJSON(payload []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

var readJSONSeeds = []string{
	`{"pad":"xxx"}`,
	`{"a":1,"b":-2.5e3,"c":9223372036854775807,"d":18446744073709551616,"e":[true,false,null,"s",{"x":[]}],"f":{}}`,
	`{"esc":"tab\there \"q\" \u00e9 \ud83d\ude00 \\ /"}`,
	`{"dup":1,"dup":"last"}`,
	"{\"bad\":\"\xff\xfe\"}",
	` [1, 2 ,3] `,
	`"just a string"`,
	`0`,
	`null`,
	"{\"nested\":" + strings.Repeat("[", 50) + strings.Repeat("]", 50) + "}",
}

// FuzzReadJSON: on any input readJSON parses, it gives what encoding/json
// gives (numbers as json.Number, the last of repeated names, U+FFFD for
// invalid UTF-8); what it refuses, encoding/json refuses too, or it is
// data after the value (which the Decoder left unread).
func FuzzReadJSON(f *testing.F) {
	for _, s := range readJSONSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"pad":"x"} {"more":1}`))
	f.Add([]byte(`{"pad":`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		var jr jsonReader
		got, err := jr.readJSON(payload)
		want, stdErr := stdJSON(payload)
		if err != nil {
			if stdErr == nil && json.Valid(payload) {
				t.Fatalf("readJSON(%q) = %v; encoding/json reads it", payload, err)
			}
			return
		}
		if stdErr != nil {
			t.Fatalf("readJSON(%q) = %#v; encoding/json refuses it: %v", payload, got, stdErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("readJSON(%q) = %#v, encoding/json %#v", payload, got, want)
		}
	})
}

func TestReadJSONRefusesDataAfterTheValue(t *testing.T) {
	var jr jsonReader
	for _, p := range []string{`{"pad":"x"} {"pad":"y"}`, `{"pad":"x"}]`, `1 2`} {
		if v, err := jr.readJSON([]byte(p)); err == nil {
			t.Errorf("readJSON(%s) = %v, want an error (data after the value)", p, v)
		}
	}
	for _, p := range []string{"{\"pad\":\"x\"}\n", " {} \t\r\n"} {
		if _, err := jr.readJSON([]byte(p)); err != nil {
			t.Errorf("readJSON(%q): %v, want white space after the value accepted", p, err)
		}
	}
}

// A payload with data after its JSON value does not fit: the encoder used
// to encode the first value and drop the rest.
func TestAvroEncodeRefusesTrailingData(t *testing.T) {
	c, err := compile(FormatAvro, `{"type":"record","name":"R","fields":[{"name":"pad","type":"string"}]}`, "")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := c.encode([]byte(`{"pad":"x"} {"pad":"lost"}`)); err == nil {
		t.Fatalf("encode = %x, want an error: the second value would be lost", b)
	}
}

const pathSchema = `{"type":"record","name":"Order","fields":[
 {"name":"id","type":"long"},
 {"name":"lines","type":{"type":"array","items":{"type":"record","name":"Line","fields":[
   {"name":"sku","type":"string"},
   {"name":"qty","type":"int"}]}}},
 {"name":"tags","type":{"type":"map","values":"string"}},
 {"name":"ref","type":["null",{"type":"record","name":"Ref","fields":[{"name":"code","type":"string"}]}],"default":null},
 {"name":"either","type":["int",{"type":"record","name":"Box","fields":[{"name":"inner","type":{"type":"array","items":"string"}}]}],"default":0}
]}`

// The misfit messages name the JSON path of the value, also after a union
// branch that failed deep inside the value, and a payload that fits
// round-trips.
func TestAvroMisfitPaths(t *testing.T) {
	c, err := compile(FormatAvro, pathSchema, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ payload, want string }{
		{`{"id":1,"lines":[{"sku":"a","qty":1},{"sku":7,"qty":1}],"tags":{}}`, "$.lines[1].sku: want string, got a number"},
		{`{"id":1,"lines":[],"tags":{"k":"v","bad":false}}`, "$.tags.bad: want string, got a boolean"},
		{`{"id":1,"lines":[{"sku":"a","qty":3000000000}],"tags":{}}`, "$.lines[0].qty: 3000000000 does not fit an avro int"},
		{`{"id":1,"lines":[],"tags":{},"ref":{"code":1}}`, "$.ref: fits no branch of the union: $.ref.code: want string, got a number"},
		{`{"id":1,"lines":[],"tags":{},"extra":1}`, "$.extra: record Order has no such field"},
		{`{"lines":[],"tags":{}}`, "$.id: required by record Order but missing"},
		// Box fails inside its array; the next message is again at $.either.
		{`{"id":1,"lines":[],"tags":{},"either":{"inner":["a",2]}}`, "$.either: fits no branch of the union: $.either: want integer, got an object\n$.either.inner[1]: want string, got a number"},
	} {
		_, err := c.encode([]byte(tc.payload))
		if err == nil || err.Error() != tc.want {
			t.Errorf("encode(%s):\n got  %v\n want %s", tc.payload, err, tc.want)
		}
	}
	ok := `{"id":1,"lines":[{"sku":"a","qty":2}],"tags":{"k":"v"},"ref":{"code":"c"},"either":{"inner":["x"]}}`
	b, err := c.encode([]byte(ok))
	if err != nil {
		t.Fatal(err)
	}
	view, err := c.decode(b)
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	_ = json.Unmarshal(view, &got)
	_ = json.Unmarshal([]byte(ok), &want)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip: %s, want %s", view, ok)
	}
	_ = avro.Null
}
