package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
)

// readJSON parses a payload into its generic value: objects as
// map[string]any, arrays as []any, numbers as json.Number (their text, so a
// long keeps every digit), strings, booleans and nil. It reads like
// encoding/json's Decoder with UseNumber: a repeated member name keeps its
// last value and invalid UTF-8 in a string becomes U+FFFD; unlike that
// Decoder, it refuses anything but white space after the value. It is the
// relay's hot path for the Avro format (every record, on every core), so it
// parses in one pass with a pooled jsontext decoder: several times cheaper
// than encoding/json's Decoder, which copies the input and scans it twice.
func (jr *jsonReader) readJSON(payload []byte) (any, error) {
	jr.r.Reset(payload)
	jr.d.Reset(&jr.r, jsonReadOptions...)
	defer jr.r.Reset(nil) // do not keep the payload alive from the pool
	v, err := readValue(&jr.d)
	if err != nil {
		return nil, err
	}
	if _, err := jr.d.ReadToken(); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("data after the JSON value")
		}
		return nil, err
	}
	return v, nil
}

var jsonReadOptions = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

// jsonReader reads payloads one after the other; its decoder keeps its
// buffers between them.
type jsonReader struct {
	r bytes.Reader
	d jsontext.Decoder
}

func readValue(d *jsontext.Decoder) (any, error) {
	tok, err := d.ReadToken()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case 'n':
		return nil, nil
	case 't', 'f':
		return tok.Bool(), nil
	case '"':
		return tok.String(), nil
	case '0':
		return json.Number(tok.String()), nil
	case '{':
		m := map[string]any{}
		for d.PeekKind() != '}' {
			name, err := d.ReadToken()
			if err != nil {
				return nil, err
			}
			k := name.String() // before the next read voids the token
			v, err := readValue(d)
			if err != nil {
				return nil, err
			}
			m[k] = v
		}
		if _, err := d.ReadToken(); err != nil {
			return nil, err
		}
		return m, nil
	case '[':
		a := []any{}
		for d.PeekKind() != ']' {
			v, err := readValue(d)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		if _, err := d.ReadToken(); err != nil {
			return nil, err
		}
		return a, nil
	}
	return nil, fmt.Errorf("unexpected JSON token %v", tok.Kind())
}

// jsonPath is where a value sits in a payload ($, $.a, $.a[2]): a stack
// of steps, pushed before a member or element is converted and popped
// after, and written out (String) only for an error message. Converting a
// valid payload builds no path text and allocates nothing for it once the
// stack has grown to the payload's depth (the stack lives in a pooled
// state).
type jsonPath struct{ steps []pathStep }

type pathStep struct {
	field string // an object member's name
	index int    // an array element's index
	elem  bool   // index, not field
}

func (p *jsonPath) field(name string) { p.steps = append(p.steps, pathStep{field: name}) }
func (p *jsonPath) elem(i int)        { p.steps = append(p.steps, pathStep{index: i, elem: true}) }
func (p *jsonPath) pop()              { p.steps = p.steps[:len(p.steps)-1] }

func (p *jsonPath) String() string {
	var b strings.Builder
	b.WriteByte('$')
	for _, s := range p.steps {
		if s.elem {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(s.index))
			b.WriteByte(']')
			continue
		}
		b.WriteByte('.')
		b.WriteString(s.field)
	}
	return b.String()
}
