package testkit

import "testing"

// NewDBUnlessShort is NewDB for unit-test packages whose database tests
// `go test -short` skips.
func NewDBUnlessShort(t *testing.T) *DB {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	return NewDB(t)
}
