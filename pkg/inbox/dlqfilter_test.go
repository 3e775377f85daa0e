package inbox

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox/status"
)

// TestErrorKeyRule pins the grouping rule of docs/console.md: words with a
// digit become '#', SQLSTATE codes stay, whitespace collapses, 240
// characters at most.
func TestErrorKeyRule(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	db := testkit.NewDB(t)
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"no digits here", "no digits here"},
		{`ERROR: payment provider timeout after 812 ms for order acct-3 (SQLSTATE P0001)`,
			`ERROR: payment provider timeout after # ms for order # (SQLSTATE P0001)`},
		{`ERROR: duplicate key value violates unique constraint "orders_pkey" (SQLSTATE 23505)`,
			`ERROR: duplicate key value violates unique constraint "orders_pkey" (SQLSTATE 23505)`},
		{`malformed record orders/3@1207: seq "x7" is not an integer`, `malformed record orders/#@#: seq "#" is not an integer`},
		{`http 503 (server error, retried): {"id":"3f8a9b2c-1d2e-4f5a-8b9c-0d1e2f3a4b5c"}`,
			`http # (server error, retried): {"id":"#"}`},
		{"line one\n\n   line\ttwo ", "line one line two"},
		{"v1.2.3 failed at step 4.", "# failed at step #"},
		{strings.Repeat("x", 300), strings.Repeat("x", 240)},
	} {
		var got string
		if err := db.Pool.QueryRow(context.Background(), `SELECT `+qErrorKey+` FROM (SELECT $1::text AS last_error) i`, c.in).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("error key of %q:\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

// TestDeadLetterFilters: each filter field selects what it says, groups
// follow the error key, and the replay order is per source by seq.
func TestDeadLetterFilters(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	ctx := context.Background()
	db := testkit.NewDB(t)
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	ins := func(consumer, id, status, source string, seq int64, typ, lastErr string, at time.Time) {
		t.Helper()
		var le any
		if lastErr != "" {
			le = lastErr
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic,
			kafka_partition, kafka_offset, status, attempts, last_error, received_at) VALUES ($1, $2, $3, $4, $5, 't', 0, 0, $6, 1, $7, $8)`,
			consumer, id, source, seq, typ, status, le, at); err != nil {
			t.Fatal(err)
		}
	}
	// Two error groups, a held row, a processed row and another consumer's row.
	for i := range 6 {
		src := fmt.Sprintf("acct-%d", i%2)
		ins("c", fmt.Sprintf("pay-%d", i), "dead", src, int64(6-i), "billing.charge",
			fmt.Sprintf("ERROR: provider timeout after %d ms (SQLSTATE P0001)", 100+i), t0.Add(time.Duration(i)*time.Minute))
	}
	ins("c", "mail-1", "dead", "user-9", 1, "email.send", "smtp 421 busy", t0.Add(10*time.Minute))
	ins("c", "late-1", "held", "user-9", 2, "email.send", "", t0.Add(11*time.Minute))
	ins("c", "done-1", "processed", "user-9", 3, "email.send", "", t0)
	ins("other", "pay-x", "dead", "acct-0", 1, "billing.charge", "ERROR: provider timeout after 1 ms (SQLSTATE P0001)", t0)

	ids := func(f DeadLetterFilter) string {
		t.Helper()
		rows, err := FindDeadLetters(ctx, db.Pool, "c", f, 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rows {
			out = append(out, r.EventID)
		}
		return strings.Join(out, " ")
	}
	for _, c := range []struct {
		name string
		f    DeadLetterFilter
		want string
	}{
		{"all", DeadLetterFilter{}, "pay-0 pay-1 pay-2 pay-3 pay-4 pay-5 mail-1 late-1"},
		{"dead only", DeadLetterFilter{Statuses: []status.Status{status.Dead}}, "pay-0 pay-1 pay-2 pay-3 pay-4 pay-5 mail-1"},
		{"held only", DeadLetterFilter{Statuses: []status.Status{status.Held}}, "late-1"},
		{"event type glob", DeadLetterFilter{EventType: "email.*"}, "mail-1 late-1"},
		{"event type exact", DeadLetterFilter{EventType: "billing.charge"}, "pay-0 pay-1 pay-2 pay-3 pay-4 pay-5"},
		{"event type underscore is literal", DeadLetterFilter{EventType: "email_send"}, ""},
		{"source", DeadLetterFilter{Source: "acct-1"}, "pay-1 pay-3 pay-5"},
		{"error text ignoring case", DeadLetterFilter{ErrorContains: "SMTP"}, "mail-1"},
		{"time range", DeadLetterFilter{ReceivedFrom: t0.Add(2 * time.Minute), ReceivedTo: t0.Add(4 * time.Minute)}, "pay-2 pay-3"},
		{"event ids", DeadLetterFilter{EventIDs: []string{"pay-4", "late-1", "pay-x"}}, "pay-4 late-1"},
	} {
		if got := ids(c.f); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}

	groups, err := GroupDeadLetters(ctx, db.Pool, "c", DeadLetterFilter{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 3 {
		t.Fatalf("groups: %+v, want 3 (timeouts, smtp, held)", groups)
	}
	g := groups[0]
	if g.Count != 6 || g.Sources != 2 || g.Status != "dead" || g.Key != "ERROR: provider timeout after # ms (SQLSTATE P0001)" ||
		g.Sample != "ERROR: provider timeout after 105 ms (SQLSTATE P0001)" || strings.Join(g.EventTypes, ",") != "billing.charge" ||
		!g.First.Equal(t0) || !g.Last.Equal(t0.Add(5*time.Minute)) {
		t.Errorf("biggest group: %+v", g)
	}
	if got := ids(DeadLetterFilter{Group: g.ID}); got != "pay-0 pay-1 pay-2 pay-3 pay-4 pay-5" {
		t.Errorf("group filter %s: got %q", g.ID, got)
	}
	n, srcs, err := CountDeadLetters(ctx, db.Pool, "c", DeadLetterFilter{Group: g.ID})
	if err != nil || n != 6 || srcs != 2 {
		t.Errorf("count of group: %d events %d sources %v", n, srcs, err)
	}
	ordered, err := DeadLettersInReplayOrder(ctx, db.Pool, "c", DeadLetterFilter{Group: g.ID}, 100)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, r := range ordered {
		order = append(order, fmt.Sprintf("%s:%d", r.Source, *r.Seq))
		if r.Group != g.ID {
			t.Errorf("%s: group %q, want %q", r.EventID, r.Group, g.ID)
		}
	}
	if got := strings.Join(order, " "); got != "acct-0:2 acct-0:4 acct-0:6 acct-1:1 acct-1:3 acct-1:5" {
		t.Errorf("replay order: %s", got)
	}
	for _, bad := range []DeadLetterFilter{{Statuses: []status.Status{status.Processed}}, {Group: "xyz"},
		{ReceivedFrom: t0, ReceivedTo: t0}} {
		if _, err := FindDeadLetters(ctx, db.Pool, "c", bad, 1); err == nil {
			t.Errorf("filter %+v accepted", bad)
		}
	}
}
