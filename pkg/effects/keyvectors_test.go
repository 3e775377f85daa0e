package effects_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
)

// keyVectorsFile holds the key cases every implementation is tested
// against: Go here, the SQL functions (TestKeyVectorsSQL) and the Python
// package (python/tests/test_keys.py). Go generates it: go test
// ./pkg/effects -run TestKeyVectors -update-key-vectors.
var keyVectorsFile = filepath.Join("testdata", "keys.json")

var updateKeyVectors = flag.Bool("update-key-vectors", false, "rewrite testdata/keys.json from the Go implementation")

// keyVector is one case: fn is "validate" (ValidateKey(args[0])), "event"
// (EventKey(args[0])), "graph" (GraphKey(args[0], args[1], args[2])),
// "validate_scope" (ValidateScope(args[0])), "escape_scope_part"
// (EscapeScopePart(args[0])) or "consumer_scope" (ConsumerScope(args[0],
// args[1], args[2])). Key is what it built (or the key or scope validated),
// empty when Invalid.
type keyVector struct {
	Fn      string   `json:"fn"`
	Args    []string `json:"args"`
	Key     string   `json:"key,omitempty"`
	Invalid bool     `json:"invalid,omitempty"`
}

type keyVectors struct {
	Comment string      `json:"comment"`
	Cases   []keyVector `json:"cases"`
}

// keyInputs is the table of inputs; the outputs come from Go.
func keyInputs() []keyVector {
	x := strings.Repeat
	v := func(fn string, args ...string) keyVector { return keyVector{Fn: fn, Args: args} }
	return []keyVector{
		v("validate", "k"),
		v("validate", ""),
		v("validate", " "),
		v("validate", "a b:c/d"),
		v("validate", x("k", effects.MaxKeyLen)),
		v("validate", x("k", effects.MaxKeyLen+1)),
		v("validate", x("é", effects.MaxKeyLen/2)),
		v("validate", x("é", effects.MaxKeyLen/2)+"k"),
		v("validate", "a\x00b"),
		v("validate", "a\nb"),
		v("validate", "tab\there"),
		v("validate", "del\x7f"),
		v("validate", "nel\u0085"),
		v("validate", "zero\u200bwidth"),
		v("validate", "emoji 🚀"),
		v("event", "ord-1"),
		v("event", "stripe:evt_1"),
		v("event", ""),
		v("event", "  "),
		v("event", "\t\n"),
		v("event", "\u00a0\u3000"),
		v("event", "\u0085"),
		v("event", "\u200b"),
		v("event", " padded "),
		v("event", "a\nb"),
		v("event", x("e", effects.MaxKeyLen-len("event:"))),
		v("event", x("e", effects.MaxKeyLen-len("event:")+1)),
		v("event", "日本語-id"),
		v("graph", "thread-7", "charge_card", "0/2/1"),
		v("graph", "", "n", "p"),
		v("graph", "t", "", "p"),
		v("graph", "t", "n", ""),
		v("graph", " ", "n", "p"),
		v("graph", "t", "\u2028", "p"),
		v("graph", "t:1", "n", "p"),
		v("graph", "t", "n:x", "p"),
		v("graph", "t", "n", "p:attempt-2"),
		v("graph", x("t", 190), "n", "p"),
		v("graph", x("t", 191), "n", "p"),
		v("graph", "t", x("é", 95), "p"),
		v("graph", "t", x("é", 95)+"n", "p"),
		v("graph", x("a", 190), x("b", 190), x("c", 190)),
		v("graph", "t", "n\t", "p"),
		v("graph", "t", "n", "p\x7f"),
		v("graph", "event", "n", "p"),
		v("graph", "Event", "n", "p"),
		v("graph", "events", "n", "p"),
		v("graph", "スレッド", "ノード", "0/1"),
		v("graph", "thread-1", "send_email", "f3a9c0de4b1a2c3d4e5f60718293a4b5"),
		v("graph", "t", " n ", "p"),
		v("validate_scope", ""),
		v("validate_scope", "billing-agent"),
		v("validate_scope", "inbox/default/http/payment.requested"),
		v("validate_scope", x("s", effects.MaxScopeLen)),
		v("validate_scope", x("s", effects.MaxScopeLen+1)),
		v("validate_scope", x("é", effects.MaxScopeLen/2)),
		v("validate_scope", x("é", effects.MaxScopeLen/2)+"s"),
		v("validate_scope", "tab\there"),
		v("validate_scope", "nul\x00"),
		v("validate_scope", "del\x7f"),
		v("validate_scope", "nel\u0085 ok"),
		v("validate_scope", "日本語/スコープ"),
		v("escape_scope_part", ""),
		v("escape_scope_part", "AZaz09-._~"),
		v("escape_scope_part", "payment.requested"),
		v("escape_scope_part", "*"),
		v("escape_scope_part", "a/b c%d"),
		v("escape_scope_part", "inbox/x/http/y"),
		v("escape_scope_part", "é日本🚀"),
		v("escape_scope_part", "!\"#$&'()*+,:;<=>?@[\\]^`{|}"),
		v("escape_scope_part", "tab\tnl\ndel\x7f"),
		v("consumer_scope", "default", "http", "payment.requested"),
		v("consumer_scope", "default", "http", "*"),
		v("consumer_scope", "agents/é 1", "http", "email.send"),
		v("consumer_scope", "a", "http", "b/c"),
		v("consumer_scope", "a/http", "b", "c"),
		v("consumer_scope", "", "", ""),
		v("consumer_scope", "billing", "http", "order:created%2F"),
	}
}

func goKey(c keyVector) (string, error) {
	switch c.Fn {
	case "validate":
		return c.Args[0], effects.ValidateKey(c.Args[0])
	case "event":
		return effects.EventKey(c.Args[0])
	case "graph":
		return effects.GraphKey(c.Args[0], c.Args[1], c.Args[2])
	case "validate_scope":
		return c.Args[0], effects.ValidateScope(c.Args[0])
	case "escape_scope_part":
		return effects.EscapeScopePart(c.Args[0]), nil
	case "consumer_scope":
		return effects.ConsumerScope(c.Args[0], c.Args[1], c.Args[2]), nil
	}
	return "", errors.New("unknown fn " + c.Fn)
}

func loadKeyVectors(t *testing.T) []keyVector {
	t.Helper()
	b, err := os.ReadFile(keyVectorsFile)
	if err != nil {
		t.Fatalf("read %s (regenerate with -update-key-vectors): %v", keyVectorsFile, err)
	}
	var f keyVectors
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", keyVectorsFile, err)
	}
	if len(f.Cases) == 0 {
		t.Fatalf("%s has no cases", keyVectorsFile)
	}
	return f.Cases
}

// TestKeyVectors: testdata/keys.json is exactly what Go computes for the
// input table, so the SQL and Python tests that read it test against Go.
func TestKeyVectors(t *testing.T) {
	t.Parallel()
	var want keyVectors
	want.Comment = "Generated by Go (go test ./pkg/effects -run TestKeyVectors -update-key-vectors). " +
		"The idempotency keys and ledger scopes Go's effects.ValidateKey/EventKey/GraphKey/" +
		"ValidateScope/EscapeScopePart/ConsumerScope accept and build; " +
		"the SQL functions and the Python package are tested against this file."
	for _, c := range keyInputs() {
		k, err := goKey(c)
		switch {
		case errors.Is(err, effects.ErrInvalidKey):
			c.Invalid = true
		case err != nil:
			t.Fatalf("%s%q: %v", c.Fn, c.Args, err)
		default:
			c.Key = k
		}
		want.Cases = append(want.Cases, c)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(want); err != nil {
		t.Fatal(err)
	}
	if *updateKeyVectors {
		if err := os.WriteFile(keyVectorsFile, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(keyVectorsFile)
	if err != nil {
		t.Fatalf("read %s (regenerate with -update-key-vectors): %v", keyVectorsFile, err)
	}
	if !bytes.Equal(got, buf.Bytes()) {
		t.Fatalf("%s differs from what Go computes; regenerate with -update-key-vectors and review the diff", keyVectorsFile)
	}
	valid, invalid := 0, 0
	for _, c := range want.Cases {
		if c.Invalid {
			invalid++
		} else {
			valid++
		}
	}
	if valid < 10 || invalid < 10 {
		t.Fatalf("%d valid and %d invalid cases: want both sides covered", valid, invalid)
	}
}

// TestKeyVectorsSQL: the SQL functions onceflow.effect_key_error,
// effect_event_key and effect_graph_key accept and build exactly what Go
// does, case by case; effect_claim rejects what ValidateKey rejects.
func TestKeyVectorsSQL(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, c := range loadKeyVectors(t) {
		var (
			key *string
			err error
		)
		switch c.Fn {
		case "validate":
			var problem *string
			err = db.Pool.QueryRow(ctx, `SELECT onceflow.effect_key_error($1)`, c.Args[0]).Scan(&problem)
			if err == nil && problem == nil {
				key = &c.Args[0]
			} else if err == nil {
				err = errors.New(*problem)
			}
		case "event":
			err = db.Pool.QueryRow(ctx, `SELECT onceflow.effect_event_key($1)`, c.Args[0]).Scan(&key)
		case "graph":
			err = db.Pool.QueryRow(ctx, `SELECT onceflow.effect_graph_key($1, $2, $3)`, c.Args[0], c.Args[1], c.Args[2]).Scan(&key)
		case "validate_scope":
			// effect_claim validates the scope before it locks anything.
			var status string
			err = conn.QueryRow(ctx, `SELECT status FROM onceflow.effect_claim('k', $1)`, c.Args[0]).Scan(&status)
			if err == nil {
				key = &c.Args[0]
				var held bool
				if err := conn.QueryRow(ctx, `SELECT onceflow.effect_release('k', $1)`, c.Args[0]).Scan(&held); err != nil || !held {
					t.Fatalf("effect_release('k', %q) = %v, %v; want true", c.Args[0], held, err)
				}
			}
		default:
			continue // escape_scope_part, consumer_scope: built in Go and Python only
		}
		switch {
		case c.Invalid && err == nil:
			t.Errorf("SQL %s%q = %q, Go rejects it", c.Fn, c.Args, *key)
		case !c.Invalid && err != nil:
			t.Errorf("SQL %s%q: %v, Go gives %q", c.Fn, c.Args, err, c.Key)
		case !c.Invalid && (key == nil || *key != c.Key):
			t.Errorf("SQL %s%q = %v, Go gives %q", c.Fn, c.Args, key, c.Key)
		}
		if c.Fn == "validate" {
			// The claim validates too, before it locks anything.
			var status string
			err := conn.QueryRow(ctx, `SELECT status FROM onceflow.effect_claim($1, 'vectors')`, c.Args[0]).Scan(&status)
			if c.Invalid != (err != nil) {
				t.Errorf("effect_claim(%q): %v, Go invalid=%v", c.Args[0], err, c.Invalid)
			}
			if err == nil {
				var held bool
				if err := conn.QueryRow(ctx, `SELECT onceflow.effect_release($1, 'vectors')`, c.Args[0]).Scan(&held); err != nil || !held {
					t.Fatalf("effect_release(%q) = %v, %v; want true", c.Args[0], held, err)
				}
			}
		}
	}
}
