package envelope

import (
	"io/fs"

	"github.com/onceflow/onceflow/pkg/envelope/spec"
)

// PayloadSchemaSuffix ends the name of a payload schema file; the rest of
// the name is the event type it governs: "order.created.schema.json".
const PayloadSchemaSuffix = spec.PayloadSchemaSuffix

// PayloadDefsSuffix ends the name of a file of shared definitions that
// payload schemas may $ref by file name ("common.defs.json#/$defs/money");
// it declares no event type.
const PayloadDefsSuffix = spec.PayloadDefsSuffix

// PayloadSchemas holds an optional JSON Schema (draft 2020-12 unless the
// schema says otherwise) per event type. A nil *PayloadSchemas declares no
// schemas, so callers can hold one unconditionally.
type PayloadSchemas = spec.PayloadSchemas

// LoadPayloadSchemas compiles every "<event-type>.schema.json" file in the
// directory dir of fsys (e.g. os.DirFS("contract"), "payloads"), with the
// "*.defs.json" files there available to their $refs. An invalid schema is
// an error naming its file.
func LoadPayloadSchemas(fsys fs.FS, dir string) (*PayloadSchemas, error) {
	return spec.LoadPayloadSchemas(fsys, dir)
}
