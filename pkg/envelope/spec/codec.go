package spec

import "encoding/json"

// Codec turns a Go value into a payload and back. Producers encode with it
// (outbox.EnqueueValue, outbox.Encode) and consumers decode with it
// (inbox.Router); ContentType is the content type the payload is sent with,
// and the one a decoder accepts.
type Codec interface {
	ContentType() string
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSONCodec is the default Codec: encoding/json, ContentTypeJSON.
type JSONCodec struct{}

// ContentType is ContentTypeJSON.
func (JSONCodec) ContentType() string { return ContentTypeJSON }

// Marshal is json.Marshal.
func (JSONCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal is json.Unmarshal.
func (JSONCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
