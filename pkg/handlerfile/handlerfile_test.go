package handlerfile

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/inbox"
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
			want:   `INSERT INTO x (id, total, seq) VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET total = EXCLUDED.total WHERE x.seq < $4`,
			params: []string{"payload.order.id", "payload.total", "seq", "seq"}},
		{name: "casts, quotes and comments are left alone",
			src:    `SELECT :payload::jsonb, ':not_a_param', "col:x", 'it''s :x' -- :comment` + "\n" + `, :event_id`,
			want:   `SELECT $1::jsonb, ':not_a_param', "col:x", 'it''s :x' -- :comment` + "\n" + `, $2`,
			params: []string{"payload", "event_id"}},
		{name: "header and array index",
			src:    `SELECT :header.tenant, :payload.items.0.sku`,
			want:   `SELECT $1, $2`,
			params: []string{"header.tenant", "payload.items.0.sku"}},
		{name: "trailing dot is not part of the name", src: `SELECT :seq.`, want: `SELECT $1.`, params: []string{"seq"}},
		{name: "hyphenated header name",
			src:    `SELECT :header.x-tenant, :header.x-tenant, :seq-1, :header.a_b-c`,
			want:   `SELECT $1, $2, $3-1, $4`,
			params: []string{"header.x-tenant", "header.x-tenant", "seq", "header.a_b-c"}},
		{name: "block comments, nested, and E strings",
			src:    `SELECT /* :a /* :b */ :c */ :seq, E'it\'s :x', e'\\', :source, E'a''b :y'`,
			want:   `SELECT /* :a /* :b */ :c */ $1, E'it\'s :x', e'\\', $2, E'a''b :y'`,
			params: []string{"seq", "source"}},
		{name: "an identifier ending in e is not an E string", src: `SELECT name':x'`, want: `SELECT name':x'`},
		{name: "unterminated block comment", src: `SELECT 1 /* /* */`, err: "unterminated /*"},
		{name: "unterminated E string", src: `SELECT E'abc\'`, err: "unterminated E''"},
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
	ev := &inbox.Event{Envelope: envelope.Envelope{EventID: "e1", Seq: 7, Headers: map[string]string{"tenant": "acme"},
		Payload: []byte(`{"order":{"id":"o-1"},"total":12.50,"ok":true,"items":[1,2],"n":null}`)}}
	args, err := st.args(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := []any{"e1", "7", "o-1", "12.50", "true", "[1,2]", nil, nil, "acme", nil, "false"}
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("args %#v\nwant %#v", args, want)
	}
	if _, err := st.args(&inbox.Event{Envelope: envelope.Envelope{Payload: []byte("not json")}}); err == nil {
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
		if _, err := Parse([]byte(src)); err == nil || !strings.Contains(err.Error(), frag) {
			t.Errorf("%s: err = %v, want %q", src, err, frag)
		}
	}
	h, err := Parse([]byte(`{"handlers": [{"event_type": "a", "kind": "sql", "sql": "SELECT :seq"}, {"event_type": "*", "kind": "log"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	c := h.(*configured)
	if c.lookup("a").kind != "sql" || c.lookup("other").kind != "log" {
		t.Fatal("lookup does not fall back to *")
	}
}

// TestSQLHandlerParamTypes: every parameter is sent as text, so one value
// goes into a text column and a typed column alike (:late into text failed
// when booleans were sent as booleans), and :header.x-tenant is a header.
func TestSQLHandlerParamTypes(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	db := testkit.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.p (
	    late_t text, late_b boolean, seq_t text, seq_n bigint, part_t text, part_n integer, off_n bigint, tenant text)`); err != nil {
		t.Fatal(err)
	}
	h, err := Parse([]byte(`{"handlers": [{"event_type": "*", "kind": "sql", "sql":
	  "INSERT INTO public.p VALUES (:late, :late, :seq, :seq, :partition, :partition, :offset, :header.x-tenant) /* :nope */"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	ev := inbox.Event{Envelope: envelope.Envelope{EventID: "e", Source: "s", Seq: 9007199254740993, Headers: map[string]string{"x-tenant": "acme"}}, Partition: 3, Offset: 41, Late: true}
	if err := h.HandleBatch(ctx, tx, []inbox.Event{ev}); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := tx.QueryRow(ctx, `SELECT format('%s|%s|%s|%s|%s|%s|%s|%s', late_t, late_b, seq_t, seq_n, part_t, part_n, off_n, tenant) FROM public.p`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "true|t|9007199254740993|9007199254740993|3|3|41|acme"; got != want {
		t.Fatalf("row %q, want %q", got, want)
	}
}
