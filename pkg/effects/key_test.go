package effects

import (
	"errors"
	"strings"
	"testing"
)

func TestEventKey(t *testing.T) {
	k, err := EventKey("ord-1")
	if err != nil || k != "event:ord-1" {
		t.Fatalf("EventKey = %q, %v", k, err)
	}
	if k, err := EventKey("stripe:evt_1"); err != nil || k != "event:stripe:evt_1" {
		t.Fatalf("EventKey with a colon = %q, %v", k, err)
	}
	for _, bad := range []string{"", "  ", "a\nb", strings.Repeat("x", MaxKeyLen), "\xff"} {
		if _, err := EventKey(bad); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("EventKey(%q) = %v, want ErrInvalidKey", bad, err)
		}
	}
}

func TestGraphKey(t *testing.T) {
	k, err := GraphKey("thread-7", "charge_card", "0/2/1")
	if err != nil || k != "thread-7:charge_card:0/2/1" {
		t.Fatalf("GraphKey = %q, %v", k, err)
	}
	cases := []struct{ thread, node, path string }{
		{"", "n", "p"}, {"t", "", "p"}, {"t", "n", ""},
		{"t:1", "n", "p"}, {"t", "n:x", "p"}, {"t", "n", "p:attempt-2"},
		{strings.Repeat("t", 191), "n", "p"}, {"t", "n\t", "p"},
		{"event", "n", "p"}, // reserved: would collide with EventKey("n:p")
	}
	for _, c := range cases {
		if _, err := GraphKey(c.thread, c.node, c.path); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("GraphKey(%q, %q, %q) = %v, want ErrInvalidKey", c.thread, c.node, c.path, err)
		}
	}
}

func TestValidateKey(t *testing.T) {
	if err := ValidateKey("k"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", strings.Repeat("k", MaxKeyLen+1), "a\x00b"} {
		if err := ValidateKey(bad); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v", bad, err)
		}
	}
}

func TestScope(t *testing.T) {
	if got := ConsumerScope("billing", "http", "order.placed"); got != "inbox/billing/http/order.placed" {
		t.Fatalf("ConsumerScope = %q", got)
	}
	// Escaping keeps the parts apart: "a/b"+"c" and "a"+"b/c" differ.
	if a, b := ConsumerScope("a/b", "http", "c"), ConsumerScope("a", "http", "b/c"); a == b {
		t.Fatalf("scopes collide: %q", a)
	}
	if got := EscapeScopePart("ok-._~Z9 *:/%é"); got != "ok-._~Z9%20%2A%3A%2F%25%C3%A9" {
		t.Fatalf("EscapeScopePart = %q", got)
	}
	if got := ConsumerScopePrefix("a b"); got != "inbox/a%20b/" {
		t.Fatalf("ConsumerScopePrefix = %q", got)
	}
	for _, ok := range []string{"", "inbox/x/http/%2A", strings.Repeat("s", MaxScopeLen)} {
		if err := ValidateScope(ok); err != nil {
			t.Errorf("ValidateScope(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"a\nb", "tab\t", "\xff", strings.Repeat("s", MaxScopeLen+1)} {
		if err := ValidateScope(bad); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ValidateScope(%q) = %v, want ErrInvalidKey", bad, err)
		}
	}
}
