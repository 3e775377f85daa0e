package itest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// The console tests' handler: public.applied records every handler run
// (seqguard_helpers_test.go); public.check_broken fails the event while its
// type has a row in public.broken, with an error that carries numbers and
// ids, as real errors do. Deleting the row is "the fix".
const consoleSchema = `
CREATE TABLE public.broken (event_type text PRIMARY KEY);
CREATE FUNCTION public.check_broken(t text, src text, s bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM public.broken WHERE event_type = t) THEN
        IF t LIKE 'billing.%' THEN
            RAISE EXCEPTION 'payment provider timeout after % ms for order %/%', 100 + (s * 37) % 900, src, s;
        END IF;
        RAISE EXCEPTION 'smtp 421 mailbox % busy, try again in % s', src, 5 + s % 50;
    END IF;
    RETURN true;
END
$$;
INSERT INTO public.broken VALUES ('billing.charge'), ('email.send');`

const consoleHandlerSQL = `INSERT INTO public.applied (event_id, source, seq, late)
SELECT :event_id, :source, :seq, :late WHERE public.check_broken(:event_type, :source, :seq)`

// Keys of the two error groups the broken handler makes.
const (
	billingKey = "ERROR: payment provider timeout after # ms for order #/# (SQLSTATE P0001)"
	emailKey   = "ERROR: smtp # mailbox # busy, try again in # s (SQLSTATE P0001)"
)

// consoleDB is a migrated database with the applied table and the broken
// handler's function.
func consoleDB(t *testing.T) *testkit.DB {
	t.Helper()
	db := seqDB(t)
	if _, err := db.Pool.Exec(context.Background(), consoleSchema); err != nil {
		t.Fatalf("console schema: %v", err)
	}
	return db
}

func consoleHandlersFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "handlers.json")
	body := fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "sql", "sql": %q}]}`, consoleHandlerSQL)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// typedEvents are seqs from..to of source with event type typ.
func typedEvents(source, typ string, from, to int64) []envelope.Envelope {
	var out []envelope.Envelope
	for s := from; s <= to; s++ {
		ev := testEvent(source, s)
		ev.EventType = typ
		out = append(out, ev)
	}
	return out
}

func produceAll(t *testing.T, cl *kgo.Client, topic string, evs []envelope.Envelope) {
	t.Helper()
	for len(evs) > 0 {
		n := min(len(evs), 200)
		produce(t, cl, topic, evs[:n]...)
		evs = evs[n:]
	}
}

// checkPerSourceOrder fails unless every source in sources was applied
// exactly for seqs 1..n, once each, in seq order.
func checkPerSourceOrder(t *testing.T, db *testkit.DB, sources []string, n int64) {
	t.Helper()
	for _, src := range sources {
		if got, want := strings.ReplaceAll(appliedOrder(t, db, src), "L", ""), seqRange(1, n); got != want {
			t.Errorf("source %s applied in order %q, want %q", src, got, want)
		}
	}
}

// apiClient calls the admin API with a token (and an actor name).
type apiClient struct {
	t     *testing.T
	base  string
	token string
	actor string
}

type apiAnswer struct {
	code   int
	header http.Header
	body   []byte
}

func (a apiAnswer) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("decode %s: %v", a.body, err)
	}
}

func (c apiClient) call(method, path string, body any) apiAnswer {
	c.t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, r)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.actor != "" {
		req.Header.Set("X-Onceflow-Actor", c.actor)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return apiAnswer{code: resp.StatusCode, header: resp.Header, body: b}
}

// get calls GET path, wants 200 and decodes the answer into v.
func (c apiClient) get(path string, v any) {
	c.t.Helper()
	a := c.call("GET", path, nil)
	if a.code != http.StatusOK {
		c.t.Fatalf("GET %s: %d %s", path, a.code, a.body)
	}
	a.decode(c.t, v)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
