package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
)

// TestEffectsCommands: `consumer effects held` lists a held effect with its
// reason; `resolve` records what the downstream did (audited), after which
// the effect is replayed from the ledger and no longer listed; `unhold` of
// an effect that is not held fails and says why; a dry run prints each
// effect's verdict.
func TestEffectsCommands(t *testing.T) {
	t.Parallel()
	db := testkit.NewDBUnlessShort(t)
	ctx := context.Background()
	lost := errors.New("response lost")
	if _, err := effects.DoScoped(ctx, db.Pool, "agent/mail", "t1:send:0", func(context.Context, string) (effects.Result, error) {
		return effects.Result{}, lost
	}); !errors.Is(err, lost) {
		t.Fatal(err)
	}
	if ok, err := effects.Hold(ctx, db.Pool, "agent/mail", "t1:send:0", "past the window"); err != nil || !ok {
		t.Fatalf("hold: %v, %v", ok, err)
	}
	// Another consumer's held effect: neither listed nor changed here.
	other := "inbox/billing/http/x"
	if _, err := effects.ClaimLease(ctx, db.Pool, other, "event:b1", "b1", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ok, err := effects.Hold(ctx, db.Pool, other, "event:b1", "past the window"); err != nil || !ok {
		t.Fatalf("hold: %v, %v", ok, err)
	}
	cmd := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(ctx, append(args, "-database-url", db.URL), &out, &errOut)
		return out.String() + errOut.String(), err
	}
	out, err := cmd("effects", "held")
	if err != nil || !strings.Contains(out, "agent/mail") || !strings.Contains(out, "t1:send:0") || !strings.Contains(out, "past the window") {
		t.Fatalf("effects held: %v\n%s", err, out)
	}
	if strings.Contains(out, "event:b1") {
		t.Fatalf("effects held lists another consumer's effect:\n%s", out)
	}
	if out, err := cmd("effects", "held", "-scope-prefix", "inbox/"); err != nil || strings.Contains(out, "t1:send:0") {
		t.Fatalf("effects held -scope-prefix inbox/: %v\n%s", err, out)
	}
	if out, err := cmd("effects", "held", "-consumer-name", "billing"); err != nil || !strings.Contains(out, "event:b1") {
		t.Fatalf("effects held -consumer-name billing: %v\n%s", err, out)
	}
	if out, err := cmd("effects", "unhold", "event:b1", "-scope", other, "-note", "x"); err == nil || !strings.Contains(err.Error(), "belongs to another consumer") {
		t.Fatalf("unhold of another consumer's effect: %v\n%s", err, out)
	}
	out, err = cmd("effects", "resolve", "t1:send:0", "-scope", "agent/mail", "-code", "250", "-result", `{"message_id":"m-1"}`,
		"-note", "the mail server has it", "-actor", "erin")
	if err != nil || !strings.Contains(out, "resolved") || !strings.Contains(out, "audit #") {
		t.Fatalf("effects resolve: %v\n%s", err, out)
	}
	r, err := effects.DoScoped(ctx, db.Pool, "agent/mail", "t1:send:0", func(context.Context, string) (effects.Result, error) {
		t.Error("a resolved effect was called")
		return effects.Result{}, nil
	})
	if err != nil || !r.Replayed || r.Code != 250 || !strings.Contains(string(r.Summary), "m-1") {
		t.Fatalf("after resolve: %+v, %v", r, err)
	}
	var actor, action string
	if err := db.Pool.QueryRow(ctx, `SELECT actor, action FROM onceflow.admin_audit ORDER BY id DESC LIMIT 1`).Scan(&actor, &action); err != nil || actor != "erin" || action != "effect.resolve" {
		t.Fatalf("audit: %q %q, %v", actor, action, err)
	}
	if out, err := cmd("effects", "held"); err != nil || strings.Contains(out, "t1:send:0") {
		t.Fatalf("effects held after resolve: %v\n%s", err, out)
	}
	if out, err := cmd("effects", "unhold", "t1:send:0", "-scope", "agent/mail", "-note", "send it"); err == nil || !strings.Contains(err.Error(), "not held (status done)") {
		t.Fatalf("unhold of a done effect: %v\n%s", err, out)
	}

	var buf bytes.Buffer
	printEffectPreview(&buf, []admin.EventOutcome{{EventID: "e1", Effects: []effects.Preview{
		{Scope: "inbox/default/http/x", Key: "event:e1", Status: "intent", Attempts: 3, AgeSeconds: 90000, WindowSeconds: 86400, Verdict: effects.VerdictPastWindow},
		{Scope: "inbox/default/http/y", Key: "event:e1", Verdict: effects.VerdictCall},
	}}})
	for _, want := range []string{"past window: would hold", "25h0m0s", "24h0m0s", "call"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("dry run effects: no %q in\n%s", want, buf.String())
		}
	}
}
