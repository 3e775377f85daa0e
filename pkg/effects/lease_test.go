package effects_test

import (
	"context"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
)

// TestLeaseClaimProtocol walks the lease protocol: a claim is busy for
// another owner while its lease runs, granted again to its own owner at
// once (a restarted owner) and to anyone once it expired (a crashed one); a
// record in a transaction that rolls back leaves the claim; a recorded
// result is done for everyone.
func TestLeaseClaimProtocol(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	const scope, key = "s", "event:e1"
	claim := func(owner string, lease time.Duration) effects.Claim {
		t.Helper()
		c, err := effects.ClaimLease(ctx, db.Pool, scope, key, "e1", owner, lease)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if c := claim("a", time.Minute); c.Status != effects.StatusClaimed || c.Attempts != 1 || c.Owner != "a" {
		t.Fatalf("first claim: %+v", c)
	}
	if c := claim("b", time.Minute); c.Status != effects.StatusBusy || c.Owner != "a" || time.Until(c.LeaseUntil) < 30*time.Second {
		t.Fatalf("claim by another owner while a's lease runs: %+v, want busy", c)
	}
	// a crashed between claim and record and restarted: same owner, same key.
	if c := claim("a", 200*time.Millisecond); c.Status != effects.StatusClaimed || c.Attempts != 2 {
		t.Fatalf("claim again by its own owner: %+v, want claimed (attempt 2)", c)
	}
	// a crashed for good: b takes over once the lease expired.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := claim("b", time.Minute)
		if c.Status == effects.StatusClaimed {
			if c.Attempts != 3 || c.Owner != "b" {
				t.Fatalf("take-over: %+v", c)
			}
			break
		}
		if c.Status != effects.StatusBusy || time.Now().After(deadline) {
			t.Fatalf("claim after the lease: %+v", c)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A record whose transaction rolls back records nothing.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := effects.RecordLease(ctx, tx, scope, key, effects.Result{Code: 201}); err != nil || !ok {
		t.Fatalf("record in a transaction: %v, %v", ok, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if e, _, _ := effects.LookupScoped(ctx, db.Pool, scope, key); e.Status != effects.StatusIntent {
		t.Fatalf("after a rolled-back record: %+v, want the intent", e)
	}
	if ok, err := effects.RecordLease(ctx, db.Pool, scope, key, effects.Result{Code: 201, Summary: []byte(`{"id":1}`)}); err != nil || !ok {
		t.Fatalf("record: %v, %v", ok, err)
	}
	if ok, err := effects.RecordLease(ctx, db.Pool, scope, key, effects.Result{Code: 500}); err != nil || ok {
		t.Fatalf("second record: %v, %v; want false (the first result kept)", ok, err)
	}
	for _, owner := range []string{"a", "b", "c"} {
		c := claim(owner, time.Minute)
		if c.Status != effects.StatusDone || !c.Result.Replayed || c.Result.Code != 201 || string(c.Result.Summary) != `{"id": 1}` {
			t.Fatalf("claim by %s after the record: %+v, want done with the first result", owner, c)
		}
	}
	// A record whose claim was lost (a database crash before the claim's
	// commit reached the disk) records the result all the same.
	if ok, err := effects.RecordLeaseOf(ctx, db.Pool, scope, "lost", "e9", effects.Result{Code: 202}); err != nil || !ok {
		t.Fatalf("record without a claim: %v, %v", ok, err)
	}
	if e, _, _ := effects.LookupScoped(ctx, db.Pool, scope, "lost"); e.Status != effects.StatusDone || e.EventID != "e9" || e.Result.Code != 202 {
		t.Fatalf("after a record without a claim: %+v", e)
	}
	// Release: the intent stays, the lease goes.
	if c, _ := effects.ClaimLease(ctx, db.Pool, scope, "k2", "", "a", time.Minute); c.Status != effects.StatusClaimed {
		t.Fatalf("claim k2: %+v", c)
	}
	if held, err := effects.ReleaseLease(ctx, db.Pool, scope, "k2", "b"); err != nil || held {
		t.Fatalf("release by a non-owner: %v, %v", held, err)
	}
	if held, err := effects.ReleaseLease(ctx, db.Pool, scope, "k2", "a"); err != nil || !held {
		t.Fatalf("release by the owner: %v, %v", held, err)
	}
	if c, _ := effects.ClaimLease(ctx, db.Pool, scope, "k2", "", "b", time.Minute); c.Status != effects.StatusClaimed || c.Attempts != 2 {
		t.Fatalf("claim after release: %+v", c)
	}
}

// TestDoLeasedHoldsNoConnection: while the call runs, DoLeased holds none of
// the pool's connections (DoScoped holds one for the whole call), and a
// second caller of the same key waits for the first one's result instead of
// calling.
func TestDoLeasedHoldsNoConnection(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	inCall := make(chan struct{})
	release := make(chan struct{})
	calls := 0
	errc := make(chan error, 1)
	go func() {
		_, err := effects.DoLeased(ctx, db.Pool, "s", "k", "a", time.Minute, func(context.Context, string) (effects.Result, error) {
			calls++
			close(inCall)
			<-release
			return effects.Result{Code: 200}, nil
		})
		errc <- err
	}()
	<-inCall
	if n := db.Pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("%d connections acquired during the call, want 0", n)
	}
	second := make(chan effects.Result, 1)
	go func() {
		r, err := effects.DoLeased(ctx, db.Pool, "s", "k", "b", time.Minute, func(context.Context, string) (effects.Result, error) {
			t.Error("second caller called while the first one's lease ran")
			return effects.Result{}, nil
		})
		if err != nil {
			t.Error(err)
		}
		second <- r
	}()
	close(release)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-second:
		if !r.Replayed || r.Code != 200 || calls != 1 {
			t.Fatalf("second caller: %+v after %d calls, want the first one's result replayed", r, calls)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("second caller never got the result")
	}
}

// TestDoWaitsForALease: Do (the session-lock protocol) on a key another
// caller claimed with a lease and is calling does not call: it waits,
// holding no connection, and returns that caller's result once recorded.
// A lease that runs out lets Do take the intent and call, with the same
// key. Before migration 027, Do found no lock and called at once.
func TestDoWaitsForALease(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	const key = "event:leased"
	if c, err := effects.ClaimLease(ctx, db.Pool, "", key, "", "other", time.Minute); err != nil || c.Status != effects.StatusClaimed {
		t.Fatalf("lease claim: %+v, %v", c, err)
	}
	calls := 0
	type res struct {
		r   effects.Result
		err error
	}
	done := make(chan res, 1)
	go func() {
		r, err := effects.Do(ctx, db.Pool, key, func(context.Context, string) (effects.Result, error) {
			calls++
			return effects.Result{Code: 500}, nil
		})
		done <- res{r, err}
	}()
	// Do claims again and again while the lease runs (each claim acquires
	// a connection; between claims it holds none).
	deadline := time.Now().Add(10 * time.Second)
	for db.Pool.Stat().AcquireCount() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("Do made %d claims in 10 s", db.Pool.Stat().AcquireCount())
		}
		time.Sleep(5 * time.Millisecond) // polling a condition
	}
	select {
	case d := <-done:
		t.Fatalf("Do returned while another caller's lease ran: %+v, %v (calls %d)", d.r, d.err, calls)
	default:
	}
	if ok, err := effects.RecordLease(ctx, db.Pool, "", key, effects.Result{Code: 201}); err != nil || !ok {
		t.Fatalf("record the lease: %v, %v", ok, err)
	}
	d := <-done
	if d.err != nil || !d.r.Replayed || d.r.Code != 201 || calls != 0 {
		t.Fatalf("Do after the lease holder recorded: %+v, %v, %d calls; want its result replayed, no call", d.r, d.err, calls)
	}
	// An expired lease: Do takes the intent over and calls with the key.
	const key2 = "event:expired-lease"
	if _, err := effects.ClaimLease(ctx, db.Pool, "", key2, "", "gone", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	r, err := effects.Do(ctx, db.Pool, key2, func(_ context.Context, k string) (effects.Result, error) {
		if k != key2 {
			t.Errorf("called with %q", k)
		}
		return effects.Result{Code: 202}, nil
	})
	if err != nil || r.Replayed || r.Code != 202 {
		t.Fatalf("Do on an expired lease: %+v, %v; want it called", r, err)
	}
}
