package effects_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
)

// TestClaimManyFollowsLeaseRules: a group claim answers each key as a
// single claim would (new, own, expired → claimed; another owner's running
// lease or a session-lock holder → busy; recorded → done with its result),
// a key given twice is claimed once, a bad element fails the group with
// nothing claimed, and a transaction that has written is refused.
func TestClaimManyFollowsLeaseRules(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	const scope = "s"
	single := func(key, owner string, lease time.Duration) {
		t.Helper()
		if c, err := effects.ClaimLease(ctx, db.Pool, scope, key, "", owner, lease); err != nil || c.Status != effects.StatusClaimed {
			t.Fatalf("claim %s: %+v, %v", key, c, err)
		}
	}
	single("event:busy", "b", time.Minute)
	single("event:own", "a", time.Minute)
	single("event:expired", "b", time.Millisecond)
	single("event:done", "b", time.Minute)
	if _, err := effects.RecordLease(ctx, db.Pool, scope, "event:done", effects.Result{Code: 201, Summary: []byte(`{"id":7}`)}); err != nil {
		t.Fatal(err)
	}
	// A session-lock holder (DoScoped's protocol) in its call.
	locked := make(chan struct{})
	unlock := make(chan struct{})
	lockErr := make(chan error, 1)
	go func() {
		_, err := effects.DoScoped(ctx, db.Pool, scope, "event:locked", func(context.Context, string) (effects.Result, error) {
			close(locked)
			<-unlock
			return effects.Result{Code: 200}, nil
		})
		lockErr <- err
	}()
	<-locked
	// The expired lease is over by the database's clock.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var over bool
		if err := db.Pool.QueryRow(ctx, `SELECT lease_until < now() FROM onceflow.effects WHERE idempotency_key = 'event:expired'`).Scan(&over); err != nil {
			t.Fatal(err)
		}
		if over {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a 1 ms lease still runs after 10 s")
		}
		time.Sleep(time.Millisecond) // polling a condition
	}
	req := func(key string) effects.ClaimRequest {
		return effects.ClaimRequest{Scope: scope, Key: key, EventID: "e-" + key, Owner: "a", Lease: time.Minute}
	}
	keys := []string{"event:new", "event:busy", "event:own", "event:expired", "event:done", "event:locked", "event:new"}
	reqs := make([]effects.ClaimRequest, len(keys))
	for i, k := range keys {
		reqs[i] = req(k)
	}
	cs, err := effects.ClaimMany(ctx, db.Pool, reqs)
	close(unlock)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-lockErr; err != nil {
		t.Fatal(err)
	}
	want := []struct {
		status   string
		attempts int
		owner    string
	}{
		{effects.StatusClaimed, 1, "a"}, {effects.StatusBusy, 1, "b"}, {effects.StatusClaimed, 2, "a"},
		{effects.StatusClaimed, 2, "a"}, {effects.StatusDone, 1, ""}, {effects.StatusBusy, 1, ""}, {effects.StatusClaimed, 1, "a"},
	}
	for i, w := range want {
		c := cs[i]
		if c.Status != w.status || c.Attempts != w.attempts || c.Owner != w.owner {
			t.Errorf("%s: %+v, want %s, attempts %d, owner %q", keys[i], c, w.status, w.attempts, w.owner)
		}
	}
	if c := cs[4]; !c.Result.Replayed || c.Result.Code != 201 || string(c.Result.Summary) != `{"id": 7}` {
		t.Errorf("done key: %+v, want its recorded result", c)
	}
	if c := cs[1]; time.Until(c.LeaseUntil) < 30*time.Second {
		t.Errorf("busy key: lease until %s, want b's (a minute)", c.LeaseUntil)
	}
	// A single claim by another owner sees the group's claims.
	if c, _ := effects.ClaimLease(ctx, db.Pool, scope, "event:new", "", "b", time.Minute); c.Status != effects.StatusBusy || c.Owner != "a" {
		t.Errorf("single claim of a group-claimed key: %+v, want busy (a)", c)
	}
	if e, _, _ := effects.LookupScoped(ctx, db.Pool, scope, "event:new"); e.EventID != "e-event:new" {
		t.Errorf("group-claimed key's row: %+v", e)
	}

	// A held key (Hold: a retry past its downstream's window) is not
	// claimed: a group answers it held, and the Claimer returns ErrHeld,
	// as a single claim does.
	single("event:held", "b", time.Minute)
	if ok, err := effects.Hold(ctx, db.Pool, scope, "event:held", "test"); err != nil || !ok {
		t.Fatalf("hold: %v, %v", ok, err)
	}
	if cs, err := effects.ClaimMany(ctx, db.Pool, []effects.ClaimRequest{req("event:held")}); err != nil || cs[0].Status != effects.StatusHeld {
		t.Fatalf("group claim of a held key: %+v, %v; want status held", cs, err)
	}
	if _, err := effects.NewClaimer(db.Pool, 8).Claim(ctx, scope, "event:held", "", "a", time.Minute); !errors.Is(err, effects.ErrHeld) {
		t.Fatalf("Claimer.Claim of a held key: %v, want ErrHeld", err)
	}
	var heldStatus string
	if err := db.Pool.QueryRow(ctx, `SELECT status FROM onceflow.effects WHERE idempotency_key = 'event:held'`).Scan(&heldStatus); err != nil || heldStatus != "held" {
		t.Fatalf("held key after the group claims: %q, %v; want still held", heldStatus, err)
	}

	// A bad element fails the group; nothing of it is claimed.
	bad := []effects.ClaimRequest{req("event:g1"), {Scope: scope, Key: "event:g2", Owner: "a", Lease: -time.Second}}
	if _, err := effects.ClaimMany(ctx, db.Pool, bad); err == nil {
		t.Fatal("group with a negative lease: no error")
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.effects WHERE idempotency_key LIKE 'event:g%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after a failed group: %d rows (%v), want none", n, err)
	}
	_, err = db.Pool.Exec(ctx, `SELECT * FROM onceflow.effect_lease_claim_many(ARRAY['event:g1'], ARRAY['s'], ARRAY[NULL], ARRAY['a'], ARRAY[interval '-1 s'])`)
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "22023" {
		t.Fatalf("negative lease in SQL: %v, want SQLSTATE 22023", err)
	}
	_, err = db.Pool.Exec(ctx, `SELECT * FROM onceflow.effect_lease_claim_many(ARRAY['event:g1', 'event:g2'], ARRAY['s'], ARRAY[NULL], ARRAY['a'], ARRAY[interval '1 s'])`)
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "22023" {
		t.Fatalf("arrays of different lengths: %v, want SQLSTATE 22023", err)
	}
	// In a transaction that has written: refused (the claims must commit
	// before the calls).
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE w (x int)`); err != nil {
		t.Fatal(err)
	}
	_, err = effects.ClaimMany(ctx, tx, []effects.ClaimRequest{req("event:g3")})
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "25001" {
		t.Fatalf("group claim in a written transaction: %v, want SQLSTATE 25001", err)
	}
}

// TestClaimerGroupsConcurrentClaims: claims asked at once through a
// Claimer get each their own answer, and go in fewer statements than
// claims (the pool's acquires count them).
func TestClaimerGroupsConcurrentClaims(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	if _, err := effects.ClaimLease(ctx, db.Pool, "s", "event:k7", "", "other", time.Minute); err != nil {
		t.Fatal(err)
	}
	cl := effects.NewClaimer(db.Pool, 64)
	before := db.Pool.Stat().AcquireCount()
	const n = 100
	var wg sync.WaitGroup
	got := make([]effects.Claim, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = cl.Claim(ctx, "s", fmt.Sprintf("event:k%d", i), "", fmt.Sprintf("o%d", i), time.Minute)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		want, owner := effects.StatusClaimed, fmt.Sprintf("o%d", i)
		if i == 7 {
			want, owner = effects.StatusBusy, "other"
		}
		if got[i].Status != want || got[i].Owner != owner {
			t.Errorf("claim %d: %+v, want %s by %s", i, got[i], want, owner)
		}
	}
	if stmts := db.Pool.Stat().AcquireCount() - before; stmts >= n/2 {
		t.Errorf("%d claims took %d statements, want them grouped", n, stmts)
	}
	// A cancelled caller gets its context's error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := cl.Claim(cctx, "s", "event:late", "", "a", time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("claim with a cancelled context: %v", err)
	}
}
