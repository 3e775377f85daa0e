package testkit

import "testing"

// SkipIfShort skips t under `go test -short` (make test-short), which runs
// only what needs no service. Every accessor of a service (DatabaseURL,
// KafkaBrokers, StartPrivateKafka, Python) calls it, so a test that reaches
// PostgreSQL, Kafka or the Python venv is skipped there and run by make test,
// where a missing service is an error, never a skip.
func SkipIfShort(t testing.TB, service string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: needs %s", service)
	}
}

// NewDBUnlessShort is NewDB; it predates SkipIfShort, which NewDB now calls
// through DatabaseURL.
func NewDBUnlessShort(t *testing.T) *DB {
	t.Helper()
	return NewDB(t)
}
