// Package effects fences external side effects (HTTP calls, e-mails,
// payments) with an idempotency key built from the event's stable identity
// and a ledger in Postgres (onceflow.effects).
//
// The inbox makes a handler's database writes exactly-once because they
// commit in the inbox transaction. An external call cannot join that
// transaction: a crash after the call and before the commit redelivers the
// event and the call runs again. Do records the intent before the call (in
// its own committed statement, so it survives the crash), the result after
// it, and sends the same key every time, so that:
//
//   - a replay whose result is recorded returns it without calling;
//   - a replay that finds only the intent calls again with the same key,
//     and the downstream (Stripe-style) dedups by that key.
//
// Keys come from stable identity only: EventKey(eventID) or, for agent
// graphs, GraphKey(threadID, node, taskPath). Attempt numbers, timestamps
// and random ids must never be part of a key, or a replay would look new.
package effects

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Sep separates the parts of a key.
const Sep = ":"

// MaxKeyLen bounds a key (bytes): room for "event:" and the envelope's
// longest event id (512 bytes). Downstreams may accept less (Stripe: 255).
const MaxKeyLen = 600

// maxPartLen bounds one part of a graph key.
const maxPartLen = 190

// eventPrefix starts an event key; a graph key's thread id may not be it,
// so the two kinds of key never collide.
const eventPrefix = "event"

// ErrInvalidKey is wrapped by every key validation error.
var ErrInvalidKey = errors.New("effects: invalid idempotency key")

// EventKey is the idempotency key of the side effect of one event:
// "event:<id>". The id is the envelope's event id, the same on every
// delivery; it may itself contain ":" (the prefix keeps it unambiguous).
func EventKey(eventID string) (string, error) {
	if strings.TrimSpace(eventID) == "" {
		return "", fmt.Errorf("%w: event id is empty", ErrInvalidKey)
	}
	return join(eventPrefix, eventID)
}

// GraphKey is the idempotency key of one task of an agent graph:
// "<thread_id>:<node>:<task_path>". The same task reached again (a replay, a
// resumed checkpoint, another delivery) has the same key. taskPath is the
// task's stable position in the graph (e.g. "0/2/1"), never an attempt or a
// run id.
func GraphKey(threadID, node, taskPath string) (string, error) {
	for _, p := range []struct{ name, v string }{{"thread id", threadID}, {"node", node}, {"task path", taskPath}} {
		if err := checkPart(p.name, p.v); err != nil {
			return "", err
		}
	}
	if threadID == eventPrefix {
		return "", fmt.Errorf("%w: thread id %q is reserved for event keys", ErrInvalidKey, eventPrefix)
	}
	return join(threadID, node, taskPath)
}

// ValidateKey checks a key given to Do: non-empty, valid UTF-8, no control
// characters, at most MaxKeyLen bytes.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return checkChars("key", key)
}

func join(parts ...string) (string, error) {
	k := strings.Join(parts, Sep)
	if err := ValidateKey(k); err != nil {
		return "", err
	}
	return k, nil
}

func checkPart(name, v string) error {
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalidKey, name)
	}
	if strings.Contains(v, Sep) {
		return fmt.Errorf("%w: %s %q contains the separator %q", ErrInvalidKey, name, v, Sep)
	}
	if len(v) > maxPartLen {
		return fmt.Errorf("%w: %s is %d bytes, at most %d", ErrInvalidKey, name, len(v), maxPartLen)
	}
	return checkChars(name, v)
}

func checkChars(name, v string) error {
	if !utf8.ValidString(v) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidKey, name)
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%w: %s contains a control character", ErrInvalidKey, name)
		}
	}
	return nil
}

// MaxScopeLen bounds a scope (bytes).
const MaxScopeLen = 512

// ValidateScope checks a scope given to DoScoped: at most MaxScopeLen bytes,
// valid UTF-8, no control characters. The empty scope is valid (Do uses it).
func ValidateScope(scope string) error {
	if len(scope) > MaxScopeLen {
		return fmt.Errorf("%w: scope is %d bytes, at most %d", ErrInvalidKey, len(scope), MaxScopeLen)
	}
	return checkChars("scope", scope)
}

// ConsumerScope is the scope of the effects of one handler of a logical
// consumer: "inbox/<consumer>/<kind>/<name>", each part escaped with
// EscapeScopePart. The consumer's http handler uses kind "http" and the
// handlers-file entry's event_type as name, so two consumer names (two
// deployments that must each apply every event) and two handler entries
// never share a ledger row.
func ConsumerScope(consumer, kind, name string) string {
	return ConsumerScopePrefix(consumer) + EscapeScopePart(kind) + "/" + EscapeScopePart(name)
}

// ConsumerScopePrefix is the start of every scope of a logical consumer
// ("inbox/<consumer>/"); retention prunes only the rows of its own prefix.
func ConsumerScopePrefix(consumer string) string {
	return "inbox/" + EscapeScopePart(consumer) + "/"
}

// EscapeScopePart percent-encodes every byte of s except the RFC 3986
// unreserved characters A-Z a-z 0-9 - . _ ~, with upper-case hex digits (the
// same as Python's urllib.parse.quote(s, safe="")). An escaped part never
// contains "/", so the parts of a scope cannot run into each other.
func EscapeScopePart(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}
