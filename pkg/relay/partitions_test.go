package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// The relay publishes a source's rows in seq order across the outbox's
// partitions (migration 034): from the legacy partition into the first id
// range, and on through ranges of ten ids.
func TestRelayPublishesAcrossPartitions(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	topic := testkit.Topic(t, "unit", 1, nil)
	rb := startRelay(t, topic)
	ctx := context.Background()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := rb.db.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var bound int64
	if err := rb.db.Pool.QueryRow(ctx, `SELECT to_id FROM onceflow.outbox_partitions WHERE relname = 'outbox_legacy'`).Scan(&bound); err != nil {
		t.Fatal(err)
	}
	n := 0
	enqueue := func(k int) {
		t.Helper()
		for range k {
			n++
			m := outbox.Message{Topic: topic, Source: "s", EventType: "x", Payload: []byte(`{}`), EventID: fmt.Sprintf("ev-%03d", n)}
			if _, err := rb.enqueue(t, outbox.Writer{}, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	exec(`SELECT setval('onceflow.outbox_id_seq', $1::bigint)`, bound-10)
	enqueue(20)
	// Ranges of ten ids above the newest range, made while the relay's
	// housekeeping cannot make one: it keeps a range ahead of the ids
	// drawn, of the newest range's width, and once the ids above passed
	// the legacy bound, a pass of it (at any time: it runs beside this
	// test) makes the next range 1,000,000 wide. Under the advisory lock
	// outbox_ensure_partitions takes, the newest range is read, the
	// sequence set above it for the narrow ranges to be made, then back
	// to ten below it: the 30 rows fill the newest range's last ids and
	// three ranges of ten ids.
	// Making a range waits at most 100 ms for its locks (SQLSTATE 55P03),
	// which the relay's own work may hold: the step is tried again.
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, rb.db.Pool, func(tx pgx.Tx) error {
			var top int64
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(x'0b0e'::integer, 0)`); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, `SELECT max(to_id) FROM onceflow.outbox_partitions`).Scan(&top); err != nil {
				return err
			}
			for _, q := range []string{
				`SELECT setval('onceflow.outbox_id_seq', $1::bigint + 30)`,
				`SELECT onceflow.outbox_ensure_partitions(10)`,
				`SELECT setval('onceflow.outbox_id_seq', $1::bigint - 10)`,
			} {
				var args []any
				if strings.Contains(q, "$1") {
					args = append(args, top)
				}
				if _, err := tx.Exec(ctx, q, args...); err != nil {
					return fmt.Errorf("%s: %w", q, err)
				}
			}
			return nil
		})
		if err == nil {
			break
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55P03" || attempt == 20 {
			t.Fatalf("ranges of ten ids: %v", err)
		}
	}
	enqueue(30)
	var places int
	if err := rb.db.Pool.QueryRow(ctx, `SELECT count(DISTINCT tableoid) FROM onceflow.outbox`).Scan(&places); err != nil {
		t.Fatal(err)
	}
	if places < 5 {
		t.Fatalf("the rows lie in %d partitions, want 5 at least (the legacy one, the first range, three of ten ids)", places)
	}

	cons := testkit.ReadCommittedClient(t, topic)
	var got []envelope.Envelope
	cctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	for len(got) < n {
		fs := cons.PollFetches(cctx)
		if cctx.Err() != nil {
			t.Fatalf("saw %d of %d records; relay logs:\n%s", len(got), n, rb.logs)
		}
		fs.EachRecord(func(r *kgo.Record) {
			env, err := envelope.Decode(r, 0)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			got = append(got, env)
		})
	}
	for i, e := range got {
		if want := fmt.Sprintf("ev-%03d", i+1); e.EventID != want || e.Seq != int64(i+1) {
			t.Fatalf("record %d: %s seq %d, want %s seq %d", i, e.EventID, e.Seq, want, i+1)
		}
	}
}
