package itest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// appliedTable records every handler run in order (n), with the Late flag;
// the unique event id makes a double apply fail loudly.
const appliedTable = `
CREATE TABLE public.applied (
    n        bigserial PRIMARY KEY,
    event_id text NOT NULL UNIQUE,
    source   text NOT NULL,
    seq      bigint NOT NULL,
    late     boolean NOT NULL
)`

const appliedSQL = `INSERT INTO public.applied (event_id, source, seq, late) VALUES (:event_id, :source, :seq, :late)`

// seqDB is a migrated test database with the applied table.
func seqDB(t *testing.T) *testkit.DB {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	db := testkit.NewDB(t)
	if _, err := db.Pool.Exec(context.Background(), appliedTable); err != nil {
		t.Fatalf("create applied table: %v", err)
	}
	return db
}

func seqHandlersFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "handlers.json")
	body := fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "sql", "sql": %q}]}`, appliedSQL)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func seqHandler(t *testing.T) inbox.BatchHandler {
	t.Helper()
	h, err := handlerfile.Load(seqHandlersFile(t))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// appliedOrder is the seqs applied for source, in handler order, a late one
// suffixed "L": "1 2 3 7L".
func appliedOrder(t testing.TB, db *testkit.DB, source string) string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT seq, late FROM public.applied WHERE source = $1 ORDER BY n`, source)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var parts []string
	for rows.Next() {
		var seq int64
		var late bool
		if err := rows.Scan(&seq, &late); err != nil {
			t.Fatal(err)
		}
		s := fmt.Sprint(seq)
		if late {
			s += "L"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// seqRange is "from to" as appliedOrder prints it.
func seqRange(from, to int64) string {
	var parts []string
	for i := from; i <= to; i++ {
		parts = append(parts, fmt.Sprint(i))
	}
	return strings.Join(parts, " ")
}

// logBuf collects an engine's JSON logs.
type logBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuf) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// lines returns the log lines containing every one of subs.
func (b *logBuf) lines(subs ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return matching(b.buf.String(), subs...)
}

func matching(out string, subs ...string) []string {
	var got []string
	for l := range strings.SplitSeq(out, "\n") {
		ok := true
		for _, s := range subs {
			if !strings.Contains(l, s) {
				ok = false
				break
			}
		}
		if ok && l != "" {
			got = append(got, l)
		}
	}
	return got
}

const givenUpMsg = `"level":"ERROR","msg":"sequence gap given up`
