package effects_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
)

// downstream counts calls per key and remembers what it did (its durable
// records, which a reconcile hook reads); its idempotency cache is taken to
// have forgotten every key older than its window.
type downstream struct {
	mu      sync.Mutex
	calls   map[string]int
	records map[string]string
}

func newDownstream() *downstream {
	return &downstream{calls: map[string]int{}, records: map[string]string{}}
}

func (d *downstream) send(key string) effects.Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls[key]++
	id := fmt.Sprintf(`{"id": "m-%s-%d"}`, key, d.calls[key])
	d.records[key] = id
	return effects.Result{Code: 200, Summary: json.RawMessage(id)}
}

func (d *downstream) count(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[key]
}

func (d *downstream) lookup(_ context.Context, key string) (*effects.Result, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.records[key]; ok {
		return &effects.Result{Code: 200, Summary: json.RawMessage(s)}, nil
	}
	return nil, nil
}

var errLost = errors.New("response lost")

// lostResponse is a first attempt whose call reaches the downstream and
// whose response is lost: the intent stays.
func lostResponse(t *testing.T, pool *pgxpool.Pool, d *downstream, key string) {
	t.Helper()
	_, err := effects.DoScoped(context.Background(), pool, "w", key, func(_ context.Context, k string) (effects.Result, error) {
		d.send(k)
		return effects.Result{}, errLost
	})
	if !errors.Is(err, errLost) {
		t.Fatalf("first attempt of %s: %v, want the lost response", key, err)
	}
}

// age moves the first attempt of key hours into the past.
func age(t *testing.T, pool *pgxpool.Pool, key string, hours int) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `UPDATE onceflow.effects SET created_at = now() - make_interval(hours => $1)
	  WHERE scope = 'w' AND idempotency_key = $2`, hours, key); err != nil {
		t.Fatal(err)
	}
}

func send(d *downstream) effects.CallFunc {
	return func(_ context.Context, k string) (effects.Result, error) { return d.send(k), nil }
}

// TestWindowRetryIsReconciledOrHeld: a retry after the downstream's
// idempotency window is never sent blindly. Without a hook it is held (and
// every claim, session-lock or lease, is refused until an operator resolves
// or unholds it); with a hook it is reconciled by key; inside the window,
// or when the hook finds nothing, it calls again with the key. The same
// retry through plain DoScoped (the code before the window) sends a second
// time.
func TestWindowRetryIsReconciledOrHeld(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	d := newDownstream()
	const day = 24 * time.Hour
	held := effects.Options{Window: day}
	row := func(key string) effects.Entry {
		t.Helper()
		e, ok, err := effects.LookupScoped(ctx, db.Pool, "w", key)
		if err != nil || !ok {
			t.Fatalf("ledger row of %s: %v, %v", key, ok, err)
		}
		return e
	}

	// What the window prevents: the old retry sends the key again, which a
	// downstream past its window takes for a new request.
	lostResponse(t, db.Pool, d, "k-blind")
	age(t, db.Pool, "k-blind", 25)
	if _, err := effects.DoScoped(ctx, db.Pool, "w", "k-blind", send(d)); err != nil || d.count("k-blind") != 2 {
		t.Fatalf("blind retry: %v, %d calls", err, d.count("k-blind"))
	}

	// Past the window, no hook: held, nothing sent, and every claim refused.
	lostResponse(t, db.Pool, d, "k-held")
	age(t, db.Pool, "k-held", 25)
	_, err := effects.DoWith(ctx, db.Pool, "w", "k-held", held, send(d))
	var he *effects.HeldError
	if !errors.As(err, &he) || he.Attempts != 2 || he.Age < day || he.Key != "k-held" || !errors.Is(err, effects.ErrHeld) {
		t.Fatalf("retry past the window: %v, want a HeldError (attempt 2)", err)
	}
	for _, retry := range []func() error{
		func() error { _, err := effects.DoWith(ctx, db.Pool, "w", "k-held", held, send(d)); return err },
		func() error { _, err := effects.DoScoped(ctx, db.Pool, "w", "k-held", send(d)); return err },
		func() error {
			_, err := effects.DoLeased(ctx, db.Pool, "w", "k-held", "o", time.Minute, send(d))
			return err
		},
	} {
		if err := retry(); !effects.IsHeld(err) {
			t.Fatalf("claim of a held key: %v, want held", err)
		}
	}
	var pe *pgconn.PgError
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.effect_claim('k-held', 'w')`); !errors.As(err, &pe) || pe.Code != "OFH01" {
		t.Fatalf("effect_claim of a held key: %v, want SQLSTATE OFH01", err)
	}
	if n := d.count("k-held"); n != 1 {
		t.Fatalf("held effect: %d calls, want 1", n)
	}
	if e := row("k-held"); e.Status != effects.StatusHeld || e.Attempts != 2 {
		t.Fatalf("held row: %+v, want held after 2 attempts (refused claims change nothing)", e)
	}
	hs, err := effects.ListHeld(ctx, db.Pool, effects.HeldFilter{}, 10)
	if err != nil || len(hs) != 1 || hs[0].Key != "k-held" || !strings.Contains(hs[0].Reason, "window of 24h0m0s") {
		t.Fatalf("ListHeld = %+v, %v", hs, err)
	}
	if n, err := effects.HeldCounts(ctx, db.Pool, "", 10); err != nil || n["w"] != 1 || len(n) != 1 {
		t.Fatalf("HeldCounts = %v, %v", n, err)
	}
	// The session lock was released with the hold: the key is not stuck.
	if conns := db.Pool.Stat().AcquiredConns(); conns != 0 {
		t.Fatalf("%d connections still acquired", conns)
	}
	// An operator lets it send: the window restarts, the next retry calls.
	if err := effects.Unhold(ctx, db.Pool, "w", "k-held"); err != nil {
		t.Fatal(err)
	}
	if r, err := effects.DoWith(ctx, db.Pool, "w", "k-held", held, send(d)); err != nil || r.Replayed || d.count("k-held") != 2 {
		t.Fatalf("after unhold: %+v, %v, %d calls", r, err, d.count("k-held"))
	}
	if err := effects.Unhold(ctx, db.Pool, "w", "k-held"); err == nil || !strings.Contains(err.Error(), "not held (status done)") {
		t.Fatalf("unhold of a done effect: %v", err)
	}

	// An operator resolves a held effect: later claims replay it.
	lostResponse(t, db.Pool, d, "k-resolve")
	age(t, db.Pool, "k-resolve", 48)
	if _, err := effects.DoWith(ctx, db.Pool, "w", "k-resolve", held, send(d)); !effects.IsHeld(err) {
		t.Fatalf("retry: %v, want held", err)
	}
	if err := effects.Resolve(ctx, db.Pool, "w", "k-resolve", effects.Result{Code: 201, Summary: json.RawMessage(`{"found":"by hand"}`)}); err != nil {
		t.Fatal(err)
	}
	if r, err := effects.DoWith(ctx, db.Pool, "w", "k-resolve", held, send(d)); err != nil || !r.Replayed || r.Code != 201 || d.count("k-resolve") != 1 {
		t.Fatalf("after resolve: %+v, %v, %d calls", r, err, d.count("k-resolve"))
	}
	if err := effects.Resolve(ctx, db.Pool, "w", "nope", effects.Result{}); err == nil || !strings.Contains(err.Error(), "no such effect") {
		t.Fatalf("resolve of a missing effect: %v", err)
	}

	// Past the window with a hook that finds the key: reconciled, not sent.
	lostResponse(t, db.Pool, d, "k-rec")
	age(t, db.Pool, "k-rec", 25)
	rec := effects.Options{Window: day, Reconcile: d.lookup}
	r, err := effects.DoWith(ctx, db.Pool, "w", "k-rec", rec, send(d))
	if err != nil || !r.Replayed || !r.Reconciled || r.Code != 200 || string(r.Summary) != `{"id": "m-k-rec-1"}` || d.count("k-rec") != 1 {
		t.Fatalf("reconciled retry: %+v (%s), %v, %d calls", r, r.Summary, err, d.count("k-rec"))
	}
	if e := row("k-rec"); e.Status != effects.StatusDone || e.Attempts != 2 || e.Result.Code != 200 {
		t.Fatalf("reconciled row: %+v", e)
	}

	// Past the window, the hook finds nothing (the first attempt never
	// reached the downstream): the call goes.
	if _, err := effects.DoScoped(ctx, db.Pool, "w", "k-none", func(context.Context, string) (effects.Result, error) {
		return effects.Result{}, errLost
	}); !errors.Is(err, errLost) {
		t.Fatal(err)
	}
	age(t, db.Pool, "k-none", 25)
	if r, err := effects.DoWith(ctx, db.Pool, "w", "k-none", rec, send(d)); err != nil || r.Replayed || d.count("k-none") != 1 {
		t.Fatalf("hook found nothing: %+v, %v, %d calls", r, err, d.count("k-none"))
	}

	// Inside the window: the downstream dedups, the retry calls with the key.
	lostResponse(t, db.Pool, d, "k-in")
	age(t, db.Pool, "k-in", 23)
	asked := 0
	inside := effects.Options{Window: day, Reconcile: func(context.Context, string) (*effects.Result, error) { asked++; return nil, nil }}
	if _, err := effects.DoWith(ctx, db.Pool, "w", "k-in", inside, send(d)); err != nil || d.count("k-in") != 2 || asked != 0 {
		t.Fatalf("inside the window: %v, %d calls, hook asked %d times", err, d.count("k-in"), asked)
	}

	// The lease path: the same rules.
	lease := func(key string, opts effects.Options, call effects.CallFunc) (effects.Result, error) {
		return effects.DoLeasedWith(ctx, db.Pool, "w", key, "owner-1", time.Minute, opts, call)
	}
	if _, err := lease("k-lease", held, func(_ context.Context, k string) (effects.Result, error) {
		d.send(k)
		return effects.Result{}, errLost
	}); !errors.Is(err, errLost) {
		t.Fatal(err)
	}
	age(t, db.Pool, "k-lease", 25)
	if _, err := lease("k-lease", held, send(d)); !errors.As(err, &he) || he.Attempts != 2 {
		t.Fatalf("leased retry past the window: %v, want held", err)
	}
	if e := row("k-lease"); e.Status != effects.StatusHeld || d.count("k-lease") != 1 {
		t.Fatalf("leased held row: %+v, %d calls", e, d.count("k-lease"))
	}
	if _, err := effects.ClaimLease(ctx, db.Pool, "w", "k-lease", "", "owner-2", time.Minute); !effects.IsHeld(err) {
		t.Fatalf("lease claim of a held key: %v, want held", err)
	}
	if _, err := lease("k-lease-rec", held, func(_ context.Context, k string) (effects.Result, error) {
		d.send(k)
		return effects.Result{}, errLost
	}); !errors.Is(err, errLost) {
		t.Fatal(err)
	}
	age(t, db.Pool, "k-lease-rec", 25)
	if r, err := lease("k-lease-rec", rec, send(d)); err != nil || !r.Reconciled || d.count("k-lease-rec") != 1 {
		t.Fatalf("leased reconcile: %+v, %v, %d calls", r, err, d.count("k-lease-rec"))
	}
	if e := row("k-lease-rec"); e.Status != effects.StatusDone || e.Result.Code != 200 {
		t.Fatalf("leased reconciled row: %+v", e)
	}

	// Options are checked.
	if _, err := effects.DoWith(ctx, db.Pool, "w", "x", effects.Options{Reconcile: d.lookup}, send(d)); err == nil || !strings.Contains(err.Error(), "needs Options.Window") {
		t.Fatalf("Reconcile without Window: %v", err)
	}
}
