package spec

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// PayloadSchemaSuffix ends the name of a payload schema file; the rest of
// the name is the event type it governs: "order.created.schema.json".
const PayloadSchemaSuffix = ".schema.json"

// PayloadDefsSuffix ends the name of a file of shared definitions that
// payload schemas may $ref by file name ("common.defs.json#/$defs/money");
// it declares no event type.
const PayloadDefsSuffix = ".defs.json"

// PayloadSchemas holds an optional JSON Schema (draft 2020-12 unless the
// schema says otherwise) per event type. A nil *PayloadSchemas declares no
// schemas, so callers can hold one unconditionally.
type PayloadSchemas struct {
	byType map[string]*jsonschema.Schema
}

// LoadPayloadSchemas compiles every "<event-type>.schema.json" file in the
// directory dir of fsys (e.g. os.DirFS("contract"), "payloads"), with the
// "*.defs.json" files there available to their $refs. An invalid schema is
// an error naming its file.
func LoadPayloadSchemas(fsys fs.FS, dir string) (*PayloadSchemas, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("payload schemas: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	// Add every file before compiling any, so that schemas may $ref each
	// other, and shared definitions, by file name.
	urls := map[string]string{}
	for _, e := range entries {
		name := e.Name()
		eventType, ok := strings.CutSuffix(name, PayloadSchemaSuffix)
		shared := strings.HasSuffix(name, PayloadDefsSuffix)
		if e.IsDir() || (!ok || eventType == "") && !shared {
			continue
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("payload schema %s: %w", name, err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("payload schema %s: %w", name, err)
		}
		url := "payloads:///" + name
		if err := c.AddResource(url, doc); err != nil {
			return nil, fmt.Errorf("payload schema %s: %w", name, err)
		}
		if !shared {
			urls[eventType] = url
		}
	}
	p := &PayloadSchemas{byType: map[string]*jsonschema.Schema{}}
	for eventType, url := range urls {
		sch, err := c.Compile(url)
		if err != nil {
			return nil, fmt.Errorf("payload schema %s%s: %w", eventType, PayloadSchemaSuffix, err)
		}
		p.byType[eventType] = sch
	}
	return p, nil
}

// EventTypes lists the event types that have a schema, sorted.
func (p *PayloadSchemas) EventTypes() []string {
	if p == nil {
		return nil
	}
	ts := make([]string, 0, len(p.byType))
	for t := range p.byType {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	return ts
}

// Validate checks payload against the schema declared for eventType. An
// event type without a schema passes. A declared schema requires a JSON
// content type ("" means JSON) and a payload that conforms; otherwise the
// error is a *PayloadError with the violation.
func (p *PayloadSchemas) Validate(eventType, contentType string, payload []byte) error {
	if p == nil {
		return nil
	}
	sch, ok := p.byType[eventType]
	if !ok {
		return nil
	}
	if contentType == "" {
		contentType = ContentTypeJSON
	}
	if !IsJSON(contentType) {
		return &PayloadError{EventType: eventType, Violation: fmt.Sprintf("content type %s is not JSON, but the event type declares a JSON Schema", contentType)}
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &PayloadError{EventType: eventType, Violation: fmt.Sprintf("payload is not JSON: %v", err)}
	}
	if err := sch.Validate(v); err != nil {
		return &PayloadError{EventType: eventType, Violation: err.Error()}
	}
	return nil
}
