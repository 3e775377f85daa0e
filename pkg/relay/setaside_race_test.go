package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/dbtx"
	"github.com/onceflow/onceflow/pkg/outbox"
	"github.com/onceflow/onceflow/pkg/relay"
	"github.com/onceflow/onceflow/pkg/relay/admin"
)

// holdCommit is an dbtx.DB whose transactions wait for release before
// they commit.
type holdCommit struct {
	dbtx.DB
	reached chan struct{}
	release chan struct{}
}

func (h holdCommit) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := h.DB.Begin(ctx)
	return heldTx{Tx: tx, h: h}, err
}

type heldTx struct {
	pgx.Tx
	h holdCommit
}

func (t heldTx) Commit(ctx context.Context) error {
	close(t.h.reached)
	<-t.h.release
	return t.Tx.Commit(ctx)
}

// TestSkipRacingRetry: an operator skips a set-aside row while its retry
// comes due. The skip checked the entry before the retry time and commits
// only after it, once the relay had its chance to publish the row (on the
// topic) or is waiting for the skip. The record must be truthful: a row
// recorded "skipped" is not on the topic, a row on the topic is recorded
// "published".
func TestSkipRacingRetry(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	topic := "missing-" + strings.ReplaceAll(t.Name(), "/", "_") + "-" + time.Now().Format("150405.000000")
	rb := startRelay(t, topic, func(c *relay.Config) { c.RetrySetAsideAfter = 4 * time.Second })
	res, err := rb.enqueue(t, outbox.Writer{}, outbox.Message{Topic: topic, Source: "s", EventType: "x", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	waitUntil(t, "the row set aside", func() bool {
		err := rb.db.Pool.QueryRow(ctx, `SELECT outbox_id FROM onceflow.outbox_set_aside WHERE resolved_at IS NULL AND retry_at > now() + interval '1 second'`).Scan(&id)
		return err == nil
	})
	testkit.CreateTopic(t, topic, 1, nil) // the retry will succeed

	h := holdCommit{DB: rb.db.Pool, reached: make(chan struct{}), release: make(chan struct{})}
	skipped := make(chan error, 1)
	go func() { skipped <- admin.SkipSetAside(ctx, h, id, "race test") }()
	select {
	case <-h.reached: // checked (not due) and deleted, not committed
	case err := <-skipped:
		t.Fatalf("skip returned before committing: %v", err)
	}
	cl := testkit.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	onTopic := 0
	waitUntil(t, "the retry published the row, or waits for the skip", func() bool {
		pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer pcancel()
		cl.PollFetches(pctx).EachRecord(func(*kgo.Record) { onTopic++ })
		var waiting bool
		_ = rb.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%outbox_set_aside%' AND query NOT LIKE '%pg_stat_activity%')`).Scan(&waiting)
		return onTopic > 0 || waiting
	})
	close(h.release)
	if err := <-skipped; err != nil && !errors.Is(err, admin.ErrRetryDue) {
		t.Fatal(err)
	}
	var resolution string
	waitUntil(t, "the entry resolved", func() bool {
		return rb.db.Pool.QueryRow(ctx, `SELECT resolution FROM onceflow.outbox_set_aside WHERE outbox_id = $1 AND resolved_at IS NOT NULL`, id).Scan(&resolution) == nil
	})
	// Read to a sentinel written now: every publish of the row, if any,
	// committed before the entry was resolved.
	if err := testkit.Client(t).ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("sentinel")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for sentinel := false; !sentinel; {
		if ctx.Err() != nil {
			t.Fatal("the sentinel never arrived")
		}
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			if string(r.Key) == "sentinel" {
				sentinel = true
			} else {
				onTopic++
			}
		})
	}
	t.Logf("event %s: resolution %q, %d records on the topic", res.EventID, resolution, onTopic)
	if (resolution == "skipped") != (onTopic == 0) || onTopic > 1 {
		t.Fatalf("set-aside entry says %q but the row is %d times on the topic", resolution, onTopic)
	}
}
