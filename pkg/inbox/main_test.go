package inbox_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/onceflow/onceflow/internal/testkit"
)

// mainTB lets TestMain use the testkit helpers (which take a testing.TB) to
// give the Example a database and a topic. Only the methods testkit calls
// are implemented; the embedded nil interface supplies the rest of the
// method set.
type mainTB struct {
	testing.TB
	cleanups []func()
}

func (m *mainTB) Helper()      {}
func (m *mainTB) Name() string { return "InboxExample" }
func (m *mainTB) Cleanup(f func()) {
	m.cleanups = append(m.cleanups, f)
}
func (m *mainTB) Logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (m *mainTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("TestMain setup: "+format, args...))
}

// runCleanups runs cleanups last-in first-out, including any registered by
// a cleanup itself.
func (m *mainTB) runCleanups() {
	for len(m.cleanups) > 0 {
		f := m.cleanups[len(m.cleanups)-1]
		m.cleanups = m.cleanups[:len(m.cleanups)-1]
		f()
	}
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// make test-short: no services, so no Example (it consumes from a
		// real topic) and no Postgres-backed tests (they skip themselves).
		if err := flag.Set("test.skip", "^Example"); err != nil {
			panic(err)
		}
		os.Exit(m.Run())
	}
	tb := &mainTB{}
	db := testkit.NewDB(tb)
	topic := testkit.Topic(tb, "example", 1, nil)
	os.Setenv("INBOX_EXAMPLE_DATABASE_URL", db.URL)
	os.Setenv("INBOX_EXAMPLE_BROKERS", testkit.KafkaBrokers(tb))
	os.Setenv("INBOX_EXAMPLE_TOPIC", topic)
	code := m.Run()
	tb.runCleanups()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", strings.TrimSpace(err.Error()))
			code = 1
		}
	}
	os.Exit(code)
}
