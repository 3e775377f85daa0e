package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
)

// TestDoRecordsAndReplays: the first Do calls and records the result; a
// replay returns the recorded result without calling.
func TestDoRecordsAndReplays(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := effects.WithEventID(context.Background(), "ev-1")
	var calls atomic.Int32
	call := func(_ context.Context, key string) (effects.Result, error) {
		calls.Add(1)
		if key != "event:ev-1" {
			t.Errorf("call got key %q", key)
		}
		return effects.Result{Code: 201, Summary: json.RawMessage(`{"id":"ch_1"}`)}, nil
	}
	r, err := effects.Do(ctx, db.Pool, "event:ev-1", call)
	if err != nil || r.Code != 201 || r.Replayed {
		t.Fatalf("first Do = %+v, %v", r, err)
	}
	for range 3 {
		r, err = effects.Do(ctx, db.Pool, "event:ev-1", call)
		if err != nil || r.Code != 201 || !r.Replayed || string(r.Summary) != `{"id": "ch_1"}` {
			t.Fatalf("replayed Do = %+v (%s), %v", r, r.Summary, err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d calls, want 1", n)
	}
	e, ok, err := effects.Lookup(ctx, db.Pool, "event:ev-1")
	if err != nil || !ok || e.Status != effects.StatusDone || e.Attempts != 1 || e.EventID != "ev-1" || e.Result.Code != 201 {
		t.Fatalf("ledger row = %+v, %v, %v", e, ok, err)
	}
}

// TestDoIntentOnlyCallsAgain: a failed call leaves the intent committed; the
// next Do calls again with the same key, and attempts counts both.
func TestDoIntentOnlyCallsAgain(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	boom := errors.New("503 from downstream")
	var keys []string
	_, err := effects.Do(ctx, db.Pool, "k", func(_ context.Context, key string) (effects.Result, error) {
		keys = append(keys, key)
		return effects.Result{}, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want the call's error wrapped", err)
	}
	e, ok, err := effects.Lookup(ctx, db.Pool, "k")
	if err != nil || !ok || e.Status != effects.StatusIntent || e.Attempts != 1 {
		t.Fatalf("after a failed call: %+v, %v, %v", e, ok, err)
	}
	r, err := effects.Do(ctx, db.Pool, "k", func(_ context.Context, key string) (effects.Result, error) {
		keys = append(keys, key)
		return effects.Result{Code: 200}, nil
	})
	if err != nil || r.Replayed || r.Code != 200 {
		t.Fatalf("retry = %+v, %v", r, err)
	}
	if len(keys) != 2 || keys[0] != "k" || keys[1] != "k" {
		t.Fatalf("keys sent = %q, want the same key twice", keys)
	}
	e, _, _ = effects.Lookup(ctx, db.Pool, "k")
	if e.Status != effects.StatusDone || e.Attempts != 2 || e.Result.Summary != nil {
		t.Fatalf("after the retry: %+v", e)
	}
}

// TestDoSameKeyConcurrently: callers with the same key are serialized by the
// advisory lock; exactly one calls, the others get its recorded result.
// Different keys are not serialized.
func TestDoSameKeyConcurrently(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	const callers = 8
	// Each waiter holds a connection while it waits for the lock: room for
	// all of them and the other key.
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = callers + 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var calls, inCall, maxIn atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, callers)
	call := func(_ context.Context, _ string) (effects.Result, error) {
		n := inCall.Add(1)
		defer inCall.Add(-1)
		for {
			m := maxIn.Load()
			if n <= m || maxIn.CompareAndSwap(m, n) {
				break
			}
		}
		calls.Add(1)
		started <- struct{}{}
		<-release
		return effects.Result{Code: 200, Summary: json.RawMessage(`{"n":1}`)}, nil
	}
	var wg sync.WaitGroup
	results := make([]effects.Result, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() { results[i], errs[i] = effects.Do(ctx, pool, "same", call) })
	}
	<-started // one caller is inside the call; the rest must be waiting
	// Another key proceeds while "same" is held.
	other, err := effects.Do(ctx, pool, "other", func(context.Context, string) (effects.Result, error) {
		return effects.Result{Code: 204}, nil
	})
	if err != nil || other.Code != 204 {
		t.Fatalf("other key while 'same' is held: %+v, %v", other, err)
	}
	close(release)
	wg.Wait()
	replayed := 0
	for i := range callers {
		if errs[i] != nil || results[i].Code != 200 {
			t.Fatalf("caller %d: %+v, %v", i, results[i], errs[i])
		}
		if results[i].Replayed {
			replayed++
		}
	}
	if calls.Load() != 1 || maxIn.Load() != 1 || replayed != callers-1 {
		t.Fatalf("calls=%d max concurrent=%d replayed=%d, want 1, 1, %d", calls.Load(), maxIn.Load(), replayed, callers-1)
	}
}

// TestDoCancelledWhileWaiting: a caller waiting for the lock gives up with
// its context; the holder is unaffected and the pool stays usable.
func TestDoCancelledWhileWaiting(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	inside := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := effects.Do(ctx, db.Pool, "held", func(context.Context, string) (effects.Result, error) {
			close(inside)
			<-release
			return effects.Result{Code: 200}, nil
		})
		done <- err
	}()
	<-inside
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := effects.Do(wctx, db.Pool, "held", func(context.Context, string) (effects.Result, error) {
		t.Error("the waiter called")
		return effects.Result{}, nil
	})
	if err == nil {
		t.Fatal("a waiter whose context ends got no error")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r, err := effects.Do(ctx, db.Pool, "held", func(context.Context, string) (effects.Result, error) {
		t.Error("called after done")
		return effects.Result{}, nil
	})
	if err != nil || !r.Replayed {
		t.Fatalf("after the holder finished: %+v, %v", r, err)
	}
}

// TestGraphKeyOneEffect: the same (thread, node, task path) reached from two
// different events gives one effect.
func TestGraphKeyOneEffect(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	var calls atomic.Int32
	for _, ev := range []string{"delivery-1", "delivery-2-replayed-checkpoint"} {
		key, err := effects.GraphKey("thread-42", "send_email", "0/3")
		if err != nil {
			t.Fatal(err)
		}
		_, err = effects.Do(effects.WithEventID(context.Background(), ev), db.Pool, key, func(context.Context, string) (effects.Result, error) {
			calls.Add(1)
			return effects.Result{Code: 202}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("%d calls, want 1", calls.Load())
	}
	e, _, _ := effects.Lookup(context.Background(), db.Pool, "thread-42:send_email:0/3")
	if e.EventID != "delivery-1" || e.Attempts != 1 {
		t.Fatalf("ledger row %+v: want the first event's id and one attempt", e)
	}
}

// TestDoScoped: one key in two scopes is two effects, each called once and
// replayed after; DoScoped waits for the advisory lock (0x0eff,
// hashtext(scope || E'\n' || key)) that every implementation of the ledger
// takes, and only for its own scope; a bad scope is refused before any I/O.
func TestDoScoped(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	var calls atomic.Int32
	call := func(_ context.Context, key string) (effects.Result, error) {
		calls.Add(1)
		return effects.Result{Code: 200}, nil
	}
	for _, scope := range []string{"inbox/a/http/x", "inbox/b/http/x", "inbox/a/http/x", "inbox/b/http/x"} {
		if _, err := effects.DoScoped(ctx, db.Pool, scope, "event:e1", call); err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls for one key in two scopes, want 2", n)
	}
	e, ok, err := effects.LookupScoped(ctx, db.Pool, "inbox/b/http/x", "event:e1")
	if err != nil || !ok || e.Scope != "inbox/b/http/x" || e.Status != effects.StatusDone {
		t.Fatalf("LookupScoped = %+v, %v, %v", e, ok, err)
	}
	if _, ok, _ := effects.Lookup(ctx, db.Pool, "event:e1"); ok {
		t.Fatal("the empty scope has a row it never wrote")
	}

	holder, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(3839, hashtext('inbox/a/http/x' || E'\n' || 'event:e2'))`); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := effects.DoScoped(short, db.Pool, "inbox/a/http/x", "event:e2", call); err == nil {
		t.Fatal("DoScoped did not wait for the held lock of its scope and key")
	}
	if _, err := effects.DoScoped(ctx, db.Pool, "inbox/b/http/x", "event:e2", call); err != nil {
		t.Fatalf("another scope's key waited: %v", err)
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock(3839, hashtext('inbox/a/http/x' || E'\n' || 'event:e2'))`); err != nil {
		t.Fatal(err)
	}
	if _, err := effects.DoScoped(ctx, db.Pool, "bad\nscope", "event:e3", call); !errors.Is(err, effects.ErrInvalidKey) {
		t.Fatalf("bad scope: %v", err)
	}
}

// TestDoScopedRunsTheSQLProtocol: DoScoped is the SQL functions, not a
// second implementation of them. A scoped key claimed and recorded through
// onceflow.effect_claim/effect_record by another session is waited for and
// then replayed; and with effect_claim gone DoScoped cannot run at all.
func TestDoScopedRunsTheSQLProtocol(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	const scope, key = "inbox/agents%2F1/http/%2A", "event:sql-1"
	holder, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	var status string
	if err := holder.QueryRow(ctx, `SELECT status FROM onceflow.effect_claim($1, $2)`, key, scope).Scan(&status); err != nil || status != effects.StatusIntent {
		t.Fatalf("SQL claim: %q, %v", status, err)
	}
	done := make(chan error, 1)
	var got effects.Result
	go func() {
		var err error
		got, err = effects.DoScoped(ctx, db.Pool, scope, key, func(context.Context, string) (effects.Result, error) {
			t.Error("DoScoped called a key the SQL caller recorded")
			return effects.Result{}, nil
		})
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for waiting := 0; waiting != 1; {
		if time.Now().After(deadline) {
			t.Fatal("DoScoped never waited on the key the SQL caller holds")
		}
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 3839 AND NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := holder.Exec(ctx, `SELECT onceflow.effect_record($1, $2, 201, '{"by":"sql"}')`, key, scope); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !got.Replayed || got.Code != 201 || string(got.Summary) != `{"by": "sql"}` {
		t.Fatalf("DoScoped after the SQL record = %+v (%s), %v", got, got.Summary, err)
	}

	if _, err := db.Pool.Exec(ctx, `ALTER FUNCTION onceflow.effect_claim(text, text, text) RENAME TO effect_claim_gone`); err != nil {
		t.Fatal(err)
	}
	_, err = effects.DoScoped(ctx, db.Pool, scope, "event:sql-2", func(context.Context, string) (effects.Result, error) {
		t.Error("DoScoped called without onceflow.effect_claim")
		return effects.Result{}, nil
	})
	if err == nil || !strings.Contains(err.Error(), "effect_claim") {
		t.Fatalf("DoScoped without onceflow.effect_claim: %v; want it to fail naming the function", err)
	}
}
