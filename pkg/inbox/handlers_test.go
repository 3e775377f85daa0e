package inbox

import (
	"reflect"
	"strings"
	"testing"
)

func TestCompileSQL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, src, want string
		params          []string
		err             string
	}{
		{name: "envelope and paths",
			src:    `INSERT INTO x (id, total, seq) VALUES (:payload.order.id, :payload.total, :seq) ON CONFLICT (id) DO UPDATE SET total = EXCLUDED.total WHERE x.seq < :seq`,
			want:   `INSERT INTO x (id, total, seq) VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET total = EXCLUDED.total WHERE x.seq < $3`,
			params: []string{"payload.order.id", "payload.total", "seq"}},
		{name: "casts, quotes and comments are left alone",
			src:    `SELECT :payload::jsonb, ':not_a_param', "col:x", 'it''s :x' -- :comment` + "\n" + `, :event_id`,
			want:   `SELECT $1::jsonb, ':not_a_param', "col:x", 'it''s :x' -- :comment` + "\n" + `, $2`,
			params: []string{"payload", "event_id"}},
		{name: "header and array index",
			src:    `SELECT :header.tenant, :payload.items.0.sku`,
			want:   `SELECT $1, $2`,
			params: []string{"header.tenant", "payload.items.0.sku"}},
		{name: "trailing dot is not part of the name", src: `SELECT :seq.`, want: `SELECT $1.`, params: []string{"seq"}},
		{name: "unknown parameter", src: `SELECT :nope`, err: "unknown parameter :nope"},
		{name: "positional parameter", src: `SELECT $1`, err: "positional"},
		{name: "unterminated quote", src: `SELECT 'abc`, err: "unterminated"},
		{name: "empty", src: `  `, err: "empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, err := compileSQL(tc.src)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.sql != tc.want {
				t.Fatalf("sql:\n got %s\nwant %s", st.sql, tc.want)
			}
			var names []string
			for _, p := range st.params {
				n := strings.TrimSuffix(p.name, ".")
				if len(p.path) > 0 {
					n += "." + strings.Join(p.path, ".")
				}
				names = append(names, n)
			}
			if !reflect.DeepEqual(names, tc.params) {
				t.Fatalf("params %v, want %v", names, tc.params)
			}
		})
	}
}

func TestSQLArgs(t *testing.T) {
	t.Parallel()
	st, err := compileSQL(`SELECT :event_id, :seq, :payload.order.id, :payload.total, :payload.ok, :payload.items, :payload.missing.x, :payload.n, :header.tenant, :header.absent, :late`)
	if err != nil {
		t.Fatal(err)
	}
	ev := &Event{EventID: "e1", Seq: 7, Headers: map[string]string{"tenant": "acme"},
		Payload: []byte(`{"order":{"id":"o-1"},"total":12.50,"ok":true,"items":[1,2],"n":null}`)}
	args, err := st.args(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"e1", int64(7), "o-1", "12.50", "true", "[1,2]", nil, nil, "acme", nil, false}
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("args %#v\nwant %#v", args, want)
	}
	if _, err := st.args(&Event{Payload: []byte("not json")}); err == nil {
		t.Fatal("a payload path on a non-JSON payload gave no error")
	}
}

func TestParseHandlerFile(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		`{"handlers": []}`: "at least one",
		`{"handlers": [{"event_type": "a", "kind": "grpc"}]}`:                                    "want sql, log or http",
		`{"handlers": [{"kind": "log"}]}`:                                                        "event_type is required",
		`{"handlers": [{"event_type": "a", "kind": "log", "sql": "SELECT 1"}]}`:                  "takes no sql",
		`{"handlers": [{"event_type": "a", "kind": "sql", "sql": "SELECT :bad"}]}`:               "handlers[0].sql: unknown parameter",
		`{"handlers": [{"event_type": "a", "kind": "log"}, {"event_type": "a", "kind": "log"}]}`: "configured twice",
		`{"handler": []}`: "unknown field",
	}
	for src, frag := range cases {
		if _, err := ParseHandlerFile([]byte(src)); err == nil || !strings.Contains(err.Error(), frag) {
			t.Errorf("%s: err = %v, want %q", src, err, frag)
		}
	}
	h, err := ParseHandlerFile([]byte(`{"handlers": [{"event_type": "a", "kind": "sql", "sql": "SELECT :seq"}, {"event_type": "*", "kind": "log"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	c := h.(*configured)
	if c.lookup("a").kind != "sql" || c.lookup("other").kind != "log" {
		t.Fatal("lookup does not fall back to *")
	}
}
