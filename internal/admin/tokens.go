package admin

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// MinTokenLen is the shortest token accepted in a token file.
const MinTokenLen = 16

// defaultTokenName names a token given without a name.
const defaultTokenName = "operator"

var tokenName = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

// Tokens are the bearer tokens the admin API accepts, each with a name that
// the audit records. Only their SHA-256 sums are kept.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	name string
	sum  [sha256.Size]byte
}

// LoadTokens reads a token file: one token per line, either TOKEN or
// NAME TOKEN (whitespace between); blank lines and lines starting with '#'
// are ignored. Tokens are at least MinTokenLen printable characters without
// spaces. Errors name the line, never a token.
func LoadTokens(path string) (*Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read token file: %w", err)
	}
	t, err := ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return t, nil
}

// ParseTokens parses the content of a token file (see LoadTokens).
func ParseTokens(data []byte) (*Tokens, error) {
	t := &Tokens{}
	names := map[string]bool{}
	sums := map[[sha256.Size]byte]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		name, tok := defaultTokenName, f[0]
		switch len(f) {
		case 1:
		case 2:
			name, tok = f[0], f[1]
		default:
			return nil, fmt.Errorf("line %d: want TOKEN or NAME TOKEN, found %d fields", n, len(f))
		}
		if !tokenName.MatchString(name) {
			return nil, fmt.Errorf("line %d: name %q: want 1 to 64 of A-Z a-z 0-9 . _ @ -", n, name)
		}
		if len(tok) < MinTokenLen {
			return nil, fmt.Errorf("line %d: the token is %d characters, at least %d are required", n, len(tok), MinTokenLen)
		}
		for _, c := range tok {
			if c < 0x21 || c > 0x7e {
				return nil, fmt.Errorf("line %d: the token has a character outside printable ASCII", n)
			}
		}
		if names[name] {
			return nil, fmt.Errorf("line %d: name %q is used twice", n, name)
		}
		sum := sha256.Sum256([]byte(tok))
		if sums[sum] {
			return nil, fmt.Errorf("line %d: the token of %q is also another line's", n, name)
		}
		names[name], sums[sum] = true, true
		t.entries = append(t.entries, tokenEntry{name: name, sum: sum})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.entries) == 0 {
		return nil, errors.New("no token in it")
	}
	return t, nil
}

// Check returns the name of the token presented, if it is one of t's. It
// compares hashes in constant time against every token, so the time taken
// says nothing about how close a guess was or which token matched.
func (t *Tokens) Check(presented string) (string, bool) {
	if t == nil || presented == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(presented))
	match := -1
	for i := range t.entries {
		eq := subtle.ConstantTimeCompare(sum[:], t.entries[i].sum[:])
		match = subtle.ConstantTimeSelect(eq, i, match)
	}
	if match < 0 {
		return "", false
	}
	return t.entries[match].name, true
}

// Names lists the token names (for the start-up log line).
func (t *Tokens) Names() []string {
	out := make([]string, len(t.entries))
	for i, e := range t.entries {
		out[i] = e.name
	}
	return out
}
