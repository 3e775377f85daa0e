package wire

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// codec converts between the JSON view of a payload and a registered
// format's encoding (without the framing).
type codec interface {
	// encode turns a JSON payload into the format's bytes; an error means the
	// payload does not fit the schema.
	encode(payload []byte) ([]byte, error)
	// decode turns the format's bytes into the JSON view.
	decode(data []byte) ([]byte, error)
	// index is the Protobuf message index path (nil otherwise).
	index() []int
}

// schemaType is the registry's schema type of a registered format.
func schemaType(f Format) sr.SchemaType {
	switch f {
	case FormatProtobuf:
		return sr.TypeProtobuf
	case FormatJSONSchema:
		return sr.TypeJSON
	}
	return sr.TypeAvro
}

// formatOf is the registered format of a registry schema type.
func formatOf(t sr.SchemaType) Format {
	switch t {
	case sr.TypeProtobuf:
		return FormatProtobuf
	case sr.TypeJSON:
		return FormatJSONSchema
	}
	return FormatAvro
}

// compile builds the codec of a schema text. message selects a Protobuf
// message ("" = the first).
func compile(f Format, schema, message string) (codec, error) {
	switch f {
	case FormatAvro:
		s, err := avro.Parse(schema)
		if err != nil {
			return nil, fmt.Errorf("avro schema: %w", err)
		}
		return &avroCodec{s: s}, nil
	case FormatProtobuf:
		return compileProto(schema, message)
	case FormatJSONSchema:
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
		if err != nil {
			return nil, fmt.Errorf("json schema: %w", err)
		}
		c := jsonschema.NewCompiler()
		if err := c.AddResource("onceflow:schema.json", doc); err != nil {
			return nil, fmt.Errorf("json schema: %w", err)
		}
		s, err := c.Compile("onceflow:schema.json")
		if err != nil {
			return nil, fmt.Errorf("json schema: %w", err)
		}
		return &jsonSchemaCodec{s: s}, nil
	}
	return nil, fmt.Errorf("format %s has no schema", f)
}

// ---------------------------------------------------------------- Avro

type avroCodec struct{ s avro.Schema }

// avroState is one encode's scratch, pooled: the JSON reader and the path
// stack keep their buffers from record to record.
type avroState struct {
	json jsonReader
	path jsonPath
}

var avroStates = sync.Pool{New: func() any { return new(avroState) }}

func (c *avroCodec) index() []int { return nil }

func (c *avroCodec) encode(payload []byte) ([]byte, error) {
	st := avroStates.Get().(*avroState)
	defer avroStates.Put(st)
	v, err := st.json.readJSON(payload)
	if err != nil {
		return nil, fmt.Errorf("payload is not JSON: %w", err)
	}
	st.path.steps = st.path.steps[:0]
	native, err := toAvro(c.s, v, &st.path)
	if err != nil {
		return nil, err
	}
	b, err := avro.Marshal(c.s, native)
	if err != nil {
		return nil, fmt.Errorf("avro: %w", err)
	}
	return b, nil
}

func (c *avroCodec) decode(data []byte) ([]byte, error) {
	var v any
	if err := avro.Unmarshal(c.s, data, &v); err != nil {
		return nil, fmt.Errorf("avro: %w", err)
	}
	return json.Marshal(fromAvro(c.s, v))
}

// toAvro converts a JSON value (numbers as json.Number) into the Go value
// hamba/avro encodes for schema s; the error names the JSON path.
func toAvro(s avro.Schema, v any, path *jsonPath) (any, error) {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return nil, misfit(path, "null", v)
		}
		return nil, nil
	case avro.Boolean:
		b, ok := v.(bool)
		if !ok {
			return nil, misfit(path, "boolean", v)
		}
		return b, nil
	case avro.Int, avro.Long:
		n, ok := v.(json.Number)
		if !ok {
			return nil, misfit(path, "integer", v)
		}
		i, err := n.Int64()
		if err != nil {
			return nil, misfit(path, "integer", v)
		}
		if s.Type() == avro.Int {
			if i < math.MinInt32 || i > math.MaxInt32 {
				return nil, fmt.Errorf("%s: %d does not fit an avro int", path.String(), i)
			}
			return int32(i), nil
		}
		return i, nil
	case avro.Float, avro.Double:
		n, ok := v.(json.Number)
		if !ok {
			return nil, misfit(path, "number", v)
		}
		f, err := n.Float64()
		if err != nil {
			return nil, misfit(path, "number", v)
		}
		if s.Type() == avro.Float {
			return float32(f), nil
		}
		return f, nil
	case avro.String:
		if _, ok := v.(string); !ok {
			return nil, misfit(path, "string", v)
		}
		return v, nil // already boxed: no copy of the string header
	case avro.Bytes, avro.Fixed:
		t, ok := v.(string)
		if !ok {
			return nil, misfit(path, "base64 string", v)
		}
		b, err := base64.StdEncoding.DecodeString(t)
		if err != nil {
			return nil, fmt.Errorf("%s: bytes are written as standard base64: %v", path.String(), err)
		}
		if fx, ok := s.(*avro.FixedSchema); ok {
			if len(b) != fx.Size() {
				return nil, fmt.Errorf("%s: fixed %s has %d bytes, got %d", path.String(), fx.FullName(), fx.Size(), len(b))
			}
			a := make([]byte, len(b))
			copy(a, b)
			return a, nil
		}
		return b, nil
	case avro.Enum:
		t, ok := v.(string)
		if !ok {
			return nil, misfit(path, "enum symbol", v)
		}
		for _, sym := range s.(*avro.EnumSchema).Symbols() {
			if sym == t {
				return v, nil
			}
		}
		return nil, fmt.Errorf("%s: %q is not a symbol of enum %s", path.String(), t, s.(*avro.EnumSchema).FullName())
	case avro.Array:
		a, ok := v.([]any)
		if !ok {
			return nil, misfit(path, "array", v)
		}
		out := make([]any, len(a))
		for i, e := range a {
			var err error
			path.elem(i)
			if out[i], err = toAvro(s.(*avro.ArraySchema).Items(), e, path); err != nil {
				return nil, err
			}
			path.pop()
		}
		return out, nil
	case avro.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, misfit(path, "object", v)
		}
		out := make(map[string]any, len(m))
		for k, e := range m {
			var err error
			path.field(k)
			if out[k], err = toAvro(s.(*avro.MapSchema).Values(), e, path); err != nil {
				return nil, err
			}
			path.pop()
		}
		return out, nil
	case avro.Record:
		m, ok := v.(map[string]any)
		if !ok {
			return nil, misfit(path, "object", v)
		}
		rs := s.(*avro.RecordSchema)
		out := make(map[string]any, len(rs.Fields()))
		matched := 0 // members of m that name a field
		for _, f := range rs.Fields() {
			fv, present := m[f.Name()]
			if !present {
				if f.HasDefault() {
					continue // hamba/avro writes the field's default
				}
				if u, ok := f.Type().(*avro.UnionSchema); ok && u.Nullable() {
					out[f.Name()] = nil
					continue
				}
				return nil, fmt.Errorf("%s.%s: required by record %s but missing", path.String(), f.Name(), rs.FullName())
			}
			matched++
			var err error
			path.field(f.Name())
			if out[f.Name()], err = toAvro(f.Type(), fv, path); err != nil {
				return nil, err
			}
			path.pop()
		}
		if matched < len(m) {
			for k := range m {
				if !hasField(rs, k) {
					return nil, fmt.Errorf("%s.%s: record %s has no such field", path.String(), k, rs.FullName())
				}
			}
		}
		return out, nil
	case avro.Union:
		u := s.(*avro.UnionSchema)
		if v == nil && u.Contains(avro.Null) {
			return nil, nil
		}
		var errs []error
		depth := len(path.steps)
		for _, t := range u.Types() {
			if t.Type() == avro.Null {
				continue
			}
			w, err := toAvro(t, v, path)
			if err != nil {
				errs = append(errs, err)
				path.steps = path.steps[:depth] // the branch stopped inside the value
				continue
			}
			if _, isMap := w.(map[string]any); u.Nullable() && !isMap {
				return w, nil
			}
			// hamba/avro reads a map[string]any in a union as
			// {branch name: value}: a record or map branch is always
			// wrapped, else its first member would be taken for a branch.
			return map[string]any{unionName(t): w}, nil
		}
		return nil, fmt.Errorf("%s: fits no branch of the union: %w", path.String(), errors.Join(errs...))
	}
	return nil, fmt.Errorf("%s: avro type %s is not supported", path.String(), s.Type())
}

func misfit(path *jsonPath, want string, v any) error {
	return fmt.Errorf("%s: want %s, got %s", path.String(), want, jsonKind(v))
}

func hasField(rs *avro.RecordSchema, name string) bool {
	for _, f := range rs.Fields() {
		if f.Name() == name {
			return true
		}
	}
	return false
}

// unionName is the name hamba/avro keys a union branch by.
func unionName(s avro.Schema) string {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	if p, ok := s.(*avro.PrimitiveSchema); ok && p.Logical() != nil {
		return string(s.Type()) + "." + string(p.Logical().Type())
	}
	return string(s.Type())
}

// fromAvro turns a decoded Avro value into its JSON view: unions unwrapped,
// bytes as base64 strings.
func fromAvro(s avro.Schema, v any) any {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	switch s.Type() {
	case avro.Union:
		u := s.(*avro.UnionSchema)
		if v == nil {
			return nil
		}
		// hamba/avro gives a union's value as {branch name: value}, but
		// a nullable union's only when the value is a record or map.
		if m, ok := v.(map[string]any); ok && len(m) == 1 {
			for name, w := range m {
				for _, t := range u.Types() {
					if unionName(t) == name {
						return fromAvro(t, w)
					}
				}
			}
		}
		for _, t := range u.Types() {
			if t.Type() != avro.Null {
				return fromAvro(t, v)
			}
		}
	case avro.Record:
		m, _ := v.(map[string]any)
		out := make(map[string]any, len(m))
		for _, f := range s.(*avro.RecordSchema).Fields() {
			if fv, ok := m[f.Name()]; ok {
				out[f.Name()] = fromAvro(f.Type(), fv)
			}
		}
		return out
	case avro.Map:
		m, _ := v.(map[string]any)
		out := make(map[string]any, len(m))
		for k, e := range m {
			out[k] = fromAvro(s.(*avro.MapSchema).Values(), e)
		}
		return out
	case avro.Array:
		a, _ := v.([]any)
		out := make([]any, len(a))
		for i, e := range a {
			out[i] = fromAvro(s.(*avro.ArraySchema).Items(), e)
		}
		return out
	case avro.Bytes, avro.Fixed:
		switch b := v.(type) {
		case []byte:
			return base64.StdEncoding.EncodeToString(b)
		}
	}
	return v
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number, float64:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// ---------------------------------------------------------------- Protobuf

type protoCodec struct {
	md  protoreflect.MessageDescriptor
	idx []int
}

func (c *protoCodec) index() []int { return c.idx }

func compileProto(schema, message string) (*protoCodec, error) {
	const name = "onceflow_schema.proto"
	comp := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{name: schema}),
		}),
	}
	files, err := comp.Compile(context.Background(), name)
	if err != nil {
		return nil, fmt.Errorf("protobuf schema: %w", err)
	}
	fd := files[0]
	var md protoreflect.MessageDescriptor
	if message == "" {
		if fd.Messages().Len() == 0 {
			return nil, fmt.Errorf("protobuf schema: declares no message")
		}
		md = fd.Messages().Get(0)
	} else {
		d := fd.FindDescriptorByName(protoreflect.FullName(strings.TrimPrefix(message, ".")))
		if d == nil {
			// Also accept the name without the package.
			if pkg := fd.Package(); pkg != "" {
				d = fd.FindDescriptorByName(pkg.Append(protoreflect.Name(message)))
			}
		}
		var ok bool
		if md, ok = d.(protoreflect.MessageDescriptor); !ok {
			return nil, fmt.Errorf("protobuf schema: no message %q", message)
		}
	}
	return &protoCodec{md: md, idx: messageIndex(md)}, nil
}

// messageIndex is the Confluent message-index path of md: its position in
// the file's messages, then in each enclosing message's nested messages.
func messageIndex(md protoreflect.MessageDescriptor) []int {
	var rev []int
	var d protoreflect.Descriptor = md
	for {
		rev = append(rev, d.Index())
		p := d.Parent()
		if _, ok := p.(protoreflect.MessageDescriptor); !ok {
			break
		}
		d = p
	}
	idx := make([]int, len(rev))
	for i := range rev {
		idx[i] = rev[len(rev)-1-i]
	}
	return idx
}

var protoView = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

func (c *protoCodec) encode(payload []byte) ([]byte, error) {
	m := dynamicpb.NewMessage(c.md)
	if err := protojson.Unmarshal(payload, m); err != nil {
		return nil, fmt.Errorf("protobuf %s: %w", c.md.FullName(), err)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("protobuf %s: %w", c.md.FullName(), err)
	}
	return b, nil
}

func (c *protoCodec) decode(data []byte) ([]byte, error) {
	m := dynamicpb.NewMessage(c.md)
	if err := proto.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("protobuf %s: %w", c.md.FullName(), err)
	}
	return protoView.Marshal(m)
}

// ---------------------------------------------------------------- JSON Schema

type jsonSchemaCodec struct{ s *jsonschema.Schema }

func (c *jsonSchemaCodec) index() []int { return nil }

func (c *jsonSchemaCodec) check(payload []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return fmt.Errorf("payload is not JSON: %w", err)
	}
	if err := c.s.Validate(inst); err != nil {
		return fmt.Errorf("json schema: %w", err)
	}
	return nil
}

func (c *jsonSchemaCodec) encode(payload []byte) ([]byte, error) {
	if err := c.check(payload); err != nil {
		return nil, err
	}
	return payload, nil
}

func (c *jsonSchemaCodec) decode(data []byte) ([]byte, error) {
	if !json.Valid(data) {
		return nil, fmt.Errorf("json-schema value is not JSON")
	}
	return data, nil
}
