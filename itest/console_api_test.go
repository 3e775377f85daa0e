package itest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	console "github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
)

// TestConsoleAPI runs the admin API against real PostgreSQL and Kafka.
// The consumer engine dead-letters 500 events of 20 sources from two bad
// "deploys" (a handler that fails while its event type is listed in
// public.broken, with errors carrying numbers and ids): each source's seq 1
// is dead-lettered where it fails, its later seqs are parked behind it, the
// gap is given up and the released events are dead-lettered in turn. Then
// the API is checked: no token / wrong token refused; filters; grouping
// (one group per bad deploy); dry run; a replay before the fix (the first
// event of the source fails, its later events are skipped); after the fix,
// bulk replays of the two groups through the sequence guard (the same
// inbox.Replay as `consumer dlq replay`), applied exactly once and per
// source in seq order; the same request id twice (also concurrently)
// replays once and answers the first result; a reused id with another
// request is refused; an expected count that no longer holds is refused;
// one audit row per change; gap resolve; lag; relay status; and the CLI's
// list -group-by error and replay -dry-run on the same rows.
func TestConsoleAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := consoleDB(t)
	topic := testkit.Topic(t, "console", 2, nil)
	group := "g-" + topic
	cl := testkit.Client(t)

	var evs []envelope.Envelope
	var billing, email []string
	for i := range 10 {
		a, u := fmt.Sprintf("acct-%d", i), fmt.Sprintf("user-%d", i)
		billing, email = append(billing, a), append(email, u)
		evs = append(evs, typedEvents(a, "billing.charge", 1, 25)...)
		evs = append(evs, typedEvents(u, "email.send", 1, 25)...)
	}
	// A source that works, and one with a gap that stays open.
	evs = append(evs, typedEvents("fine-1", "audit.log", 1, 5)...)
	evs = append(evs, typedEvents("gappy", "audit.log", 1, 1)...)
	evs = append(evs, typedEvents("gappy", "audit.log", 3, 3)...)
	produceAll(t, cl, topic, evs)

	h, err := handlerfile.Load(consoleHandlersFile(t))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: group, Topics: []string{topic}, BatchHandler: h,
		RetryMaxAttempts: 1, GapCheckInterval: 100 * time.Millisecond, GapTimeout: 10 * time.Minute,
		GapTimeouts: []inbox.GapTimeout{{Pattern: "billing.*", Timeout: 300 * time.Millisecond}, {Pattern: "email.*", Timeout: 300 * time.Millisecond}}})
	eventually(t, 2*time.Minute, "500 dead letters, nothing parked but gappy's seq 3", func() (bool, string) {
		dead := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'dead'`)
		parked := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'parked'`)
		applied := count(t, db, `SELECT count(*) FROM public.applied`)
		return dead == 500 && parked == 1 && applied == 6, fmtState("dead ", dead, ", parked ", parked, ", applied ", applied)
	})
	e.stop(t)
	t.Logf("seeded 500 dead letters of 20 sources (2 errors) and %d given-up gaps by the engine in %s",
		count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`), time.Since(start).Round(time.Millisecond))
	// A held event (a late event kept for an operator), for the held list.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.inbox (consumer, event_id, source, seq, event_type, topic, kafka_partition,
		kafka_offset, status, late) VALUES ('default', 'late-1', 'gappy', 2, 'audit.log', $1, 0, 999, 'held', true)`, topic); err != nil {
		t.Fatal(err)
	}

	// The admin service and API, as `consumer run -admin` builds them.
	var logs logBuf
	kc := testkit.Client(t)
	svc, err := console.NewService(console.Config{Group: group, Topics: []string{topic}, Kafka: kadm.NewClient(kc), Logger: logs.logger(),
		Pool: db.Pool, Replay: func(ctx context.Context, id string) (inbox.ReplayResult, error) {
			return inbox.Replay(ctx, db.Pool, "", h, id)
		}})
	if err != nil {
		t.Fatal(err)
	}
	const token = "console-test-token-3b9f2a"
	toks, err := console.ParseTokens([]byte("oncall " + token))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(console.NewHandler(svc, toks, logs.logger()))
	defer srv.Close()
	api := apiClient{t: t, base: srv.URL, token: token, actor: "alice"}

	// Without a token, with a wrong one: refused, nothing done.
	for _, tok := range []string{"", "wrong-token-of-enough-length", token + "x"} {
		anon := apiClient{t: t, base: srv.URL, token: tok}
		if a := anon.call("GET", "/api/v1/dead-letters/groups", nil); a.code != http.StatusUnauthorized {
			t.Errorf("groups with token %q: %d %s", tok, a.code, a.body)
		}
		if a := anon.call("POST", "/api/v1/dead-letters/replay", map[string]any{"request_id": "anon", "all": true, "note": "x"}); a.code != http.StatusUnauthorized {
			t.Errorf("replay with token %q: %d %s", tok, a.code, a.body)
		}
	}

	// Grouping: one group per bad deploy (plus the held row).
	var groups struct{ Groups []console.Group }
	api.get("/api/v1/dead-letters/groups", &groups)
	byKey := map[string]console.Group{}
	for _, g := range groups.Groups {
		byKey[g.Status+" "+g.Key] = g
	}
	gb, ge := byKey["dead "+billingKey], byKey["dead "+emailKey]
	if len(groups.Groups) != 3 || gb.Count != 250 || gb.Sources != 10 || ge.Count != 250 || ge.Sources != 10 || byKey["held "].Count != 1 {
		t.Fatalf("groups: %+v", groups.Groups)
	}
	if strings.Join(gb.EventTypes, ",") != "billing.charge" || !strings.HasPrefix(gb.Sample, "ERROR: payment provider timeout after ") {
		t.Errorf("billing group: %+v", gb)
	}
	t.Logf("groups: %q ×%d, %q ×%d", gb.Key, gb.Count, ge.Key, ge.Count)

	// Filters.
	listed := func(q string) []console.DeadLetter {
		t.Helper()
		var out struct {
			DeadLetters []console.DeadLetter `json:"dead_letters"`
		}
		api.get("/api/v1/dead-letters?limit=1000&"+q, &out)
		return out.DeadLetters
	}
	var mid time.Time
	if err := db.Pool.QueryRow(ctx, `SELECT received_at FROM onceflow.inbox WHERE status = 'dead' ORDER BY received_at, event_id OFFSET 200 LIMIT 1`).Scan(&mid); err != nil {
		t.Fatal(err)
	}
	wantBefore := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status IN ('dead', 'held') AND received_at < $1`, mid)
	for _, c := range []struct {
		q    string
		want int
	}{
		{"", 501},
		{"status=dead", 500},
		{"status=held", 1},
		{"event_type=billing.*", 250},
		{"event_type=billing.charge&source=acct-3", 25},
		{"source=user-0", 25},
		{"error=SMTP+421", 250},
		{"error=mailbox+user-7+busy", 25},
		{"group=" + gb.ID, 250},
		{"group=" + ge.ID + "&source=user-1", 25},
		{"to=" + mid.UTC().Format(time.RFC3339Nano), wantBefore},
		{"from=" + mid.UTC().Format(time.RFC3339Nano), 501 - wantBefore},
		{"since=1h", 501},
	} {
		if got := len(listed(c.q)); got != c.want {
			t.Errorf("dead letters ?%s: %d, want %d", c.q, got, c.want)
		}
	}
	if a := api.call("GET", "/api/v1/dead-letters?from=yesterday", nil); a.code != http.StatusBadRequest || !strings.Contains(string(a.body), "from") {
		t.Errorf("bad from: %d %s", a.code, a.body)
	}
	var held struct{ Held []console.DeadLetter }
	api.get("/api/v1/held", &held)
	if len(held.Held) != 1 || held.Held[0].EventID != "late-1" {
		t.Errorf("held: %+v", held.Held)
	}

	// The CLI reads the same rows with the same filters and groups.
	bin := testkit.Binary(t, "consumer")
	env := []string{"ONCEFLOW_DATABASE_URL=" + db.URL}
	out := runBin(t, bin, env, "dlq", "list", "-group-by", "error", "-status", "dead")
	for _, want := range []string{gb.ID, ge.ID, billingKey, emailKey, "250"} {
		if !strings.Contains(out, want) {
			t.Errorf("dlq list -group-by error lacks %q:\n%s", want, out)
		}
	}
	out = runBin(t, bin, env, "dlq", "replay", "-dry-run", "-error-group", ge.ID)
	if !strings.Contains(out, "dry run: 250 event(s) of 10 source(s) match") {
		t.Errorf("dlq replay -dry-run:\n%s", out)
	}
	if out := runBin(t, bin, env, "dlq", "list", "-source", "acct-3", "-limit", "100"); strings.Count(out, "acct-3-") != 25 {
		t.Errorf("dlq list -source acct-3 lists %d rows:\n%s", strings.Count(out, "acct-3-"), out)
	}

	// Dry run: counts, changes nothing, is not audited.
	var dry console.ReplayOutcome
	a := api.call("POST", "/api/v1/dead-letters/replay", console.ReplayRequest{DryRun: true, Filter: console.FilterParams{Group: gb.ID}})
	if a.code != http.StatusOK {
		t.Fatalf("dry run: %d %s", a.code, a.body)
	}
	a.decode(t, &dry)
	if !dry.DryRun || dry.Matched != 250 || dry.Sources != 10 || len(dry.Events) != 20 || dry.Events[0].EventID != "acct-0-1" ||
		len(dry.Groups) != 1 || dry.Groups[0].ID != gb.ID {
		t.Errorf("dry run: %+v", dry)
	}

	// Before the fix: the source's first event fails, its others wait.
	var early console.ReplayOutcome
	a = api.call("POST", "/api/v1/dead-letters/replay", console.ReplayRequest{RequestID: "req-early", Note: "try acct-0 before the fix",
		Filter: console.FilterParams{Source: "acct-0"}})
	a.decode(t, &early)
	if a.code != http.StatusOK || early.Matched != 25 || early.Failed != 1 || early.Skipped != 24 || early.Replayed+early.ReplayedLate != 0 ||
		!strings.Contains(early.Events[0].Error, "payment provider timeout") || early.Events[0].EventID != "acct-0-1" {
		t.Fatalf("replay before the fix: %d %+v", a.code, early)
	}
	if n := count(t, db, `SELECT count(*) FROM public.applied`); n != 6 || count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'dead'`) != 500 {
		t.Fatalf("the failed replay changed something: applied %d", n)
	}
	// The failed event keeps its error group (a failed replay records its
	// error as the engine does).
	if n := len(listed("group=" + gb.ID)); n != 250 {
		t.Fatalf("billing group has %d events after a failed replay, want 250", n)
	}

	// The fix.
	if _, err := db.Pool.Exec(ctx, `DELETE FROM public.broken`); err != nil {
		t.Fatal(err)
	}

	// Group replay with an expected count; a repeat of the request id
	// answers the first result and does nothing.
	replayReq := console.ReplayRequest{RequestID: "req-billing", Note: "provider timeout raised in handler config (INC-42)",
		Filter: console.FilterParams{Group: gb.ID}, Expect: ptr(250)}
	t0 := time.Now()
	a = api.call("POST", "/api/v1/dead-letters/replay", replayReq)
	took := time.Since(t0)
	var first console.ReplayOutcome
	a.decode(t, &first)
	// Most are late (their gaps were given up); a seq that the engine
	// dead-lettered as the next one in order is replayed in order.
	if a.code != http.StatusOK || first.Matched != 250 || first.Attempted != 250 || first.Replayed+first.ReplayedLate != 250 || first.Failed != 0 ||
		first.Skipped != 0 || first.Repeated || a.header.Get(console.RepeatedHeader) != "" {
		t.Fatalf("billing group replay: %d %+v", a.code, first)
	}
	t.Logf("replayed 250 dead letters of 10 sources through the sequence guard in %s", took.Round(time.Millisecond))
	checkPerSourceOrder(t, db, billing, 25)
	again := api.call("POST", "/api/v1/dead-letters/replay", replayReq)
	var second console.ReplayOutcome
	again.decode(t, &second)
	if again.code != http.StatusOK || again.header.Get(console.RepeatedHeader) != "true" || !second.Repeated ||
		second.Replayed != first.Replayed || second.ReplayedLate != first.ReplayedLate ||
		second.AuditID != first.AuditID || second.AlreadyProcessed != 0 {
		t.Fatalf("same request id again: %d %+v", again.code, second)
	}
	if n := count(t, db, `SELECT count(*) FROM public.applied`); n != 6+250 {
		t.Fatalf("applied %d after the repeat, want %d", n, 6+250)
	}
	// The same id for another request is refused.
	other := replayReq
	other.Filter = console.FilterParams{Group: ge.ID}
	if a := api.call("POST", "/api/v1/dead-letters/replay", other); a.code != http.StatusUnprocessableEntity {
		t.Errorf("request id reused for another request: %d %s", a.code, a.body)
	}

	// The other group: the same request sent twice at once applies once.
	emailReq := console.ReplayRequest{RequestID: "req-email", Note: "smtp relay back (INC-43)", Filter: console.FilterParams{Group: ge.ID}}
	var wg sync.WaitGroup
	answers := make([]apiAnswer, 2)
	for i := range answers {
		wg.Go(func() { answers[i] = api.call("POST", "/api/v1/dead-letters/replay", emailReq) })
	}
	wg.Wait()
	var o1, o2 console.ReplayOutcome
	answers[0].decode(t, &o1)
	answers[1].decode(t, &o2)
	if answers[0].code != 200 || answers[1].code != 200 || o1.Replayed+o1.ReplayedLate != 250 || o1.Replayed != o2.Replayed ||
		o1.ReplayedLate != o2.ReplayedLate || o1.AlreadyProcessed+o2.AlreadyProcessed != 0 || o1.Repeated == o2.Repeated ||
		o1.AuditID != o2.AuditID {
		t.Fatalf("concurrent same request: %d %+v / %d %+v", answers[0].code, o1, answers[1].code, o2)
	}
	checkPerSourceOrder(t, db, email, 25)
	if n := count(t, db, `SELECT count(*) FROM public.applied`); n != 6+500 {
		t.Fatalf("applied %d, want %d", n, 6+500)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'dead'`); n != 0 {
		t.Fatalf("%d dead letters left", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'processed' AND (source LIKE 'acct-%' OR source LIKE 'user-%')`); n != 500 {
		t.Errorf("%d of the 500 rows processed", n)
	}

	// One event by id: already processed now; an unknown id is 404.
	var one console.ReplayOutcome
	a = api.call("POST", "/api/v1/dead-letters/replay", console.ReplayRequest{RequestID: "req-one", EventID: "acct-0-1"})
	a.decode(t, &one)
	if a.code != http.StatusOK || one.AlreadyProcessed != 1 || len(one.Events) != 1 || one.Events[0].Result != "already processed" {
		t.Errorf("replay of one processed event: %d %+v", a.code, one)
	}
	if a := api.call("POST", "/api/v1/dead-letters/replay", console.ReplayRequest{RequestID: "req-none", EventID: "no-such-event"}); a.code != http.StatusNotFound {
		t.Errorf("replay of an unknown event: %d %s", a.code, a.body)
	}

	// An expected count that no longer holds: refused (and audited).
	stale := console.ReplayRequest{RequestID: "req-stale", Note: "again", Filter: console.FilterParams{EventType: "billing.*"}, Expect: ptr(250)}
	if a := api.call("POST", "/api/v1/dead-letters/replay", stale); a.code != http.StatusConflict || !strings.Contains(string(a.body), "count_changed") {
		t.Errorf("stale expected count: %d %s", a.code, a.body)
	}

	// Gaps: gappy's gap is open, the 20 failing sources' gaps given up.
	var gaps struct{ Gaps []console.Gap }
	api.get("/api/v1/gaps", &gaps)
	states := map[string]int{}
	for _, g := range gaps.Gaps {
		states[g.State]++
		if g.State == "open" && (g.Source != "gappy" || g.From != 2 || g.To != 2) {
			t.Errorf("open gap %+v", g)
		}
	}
	// Each failing source has at least one given-up gap (more when its
	// events came in several fetches: every dead seq opens a gap again).
	givenUpSources := map[string]bool{}
	for _, g := range gaps.Gaps {
		if g.State == "given_up" {
			givenUpSources[g.Source] = true
		}
	}
	if states["open"] != 1 || len(givenUpSources) != 20 || givenUpSources["gappy"] || givenUpSources["fine-1"] {
		t.Errorf("gaps by state %v of sources %v, want 1 open and given-up ones of the 20 failing sources", states, keys(givenUpSources))
	}
	resolve := console.ResolveRequest{RequestID: "req-gap", Source: "acct-3", From: 1, To: 1, Note: "seq 1 replayed late after INC-42"}
	var res console.ResolveOutcome
	a = api.call("POST", "/api/v1/gaps/resolve", resolve)
	a.decode(t, &res)
	if a.code != 200 || res.Resolved != 1 {
		t.Errorf("resolve: %d %+v", a.code, res)
	}
	a = api.call("POST", "/api/v1/gaps/resolve", resolve)
	a.decode(t, &res)
	if a.code != 200 || !res.Repeated || res.Resolved != 1 {
		t.Errorf("resolve repeated: %d %+v", a.code, res)
	}
	if a := api.call("POST", "/api/v1/gaps/resolve", console.ResolveRequest{RequestID: "req-nogap", Source: "acct-3", From: 1, To: 1, Note: "x"}); a.code != http.StatusNotFound {
		t.Errorf("resolve of a resolved gap: %d %s", a.code, a.body)
	}
	// Giving up a gap that is not open: refused, audited (the CLI test
	// TestGapGiveUpNow gives an open one up through the same service).
	if a := api.call("POST", "/api/v1/gaps/give-up", console.GiveUpRequest{RequestID: "req-giveup", Source: "acct-3", From: 1, To: 1, Note: "x"}); a.code != http.StatusNotFound ||
		!strings.Contains(string(a.body), "no open gap") {
		t.Errorf("give-up of a given-up gap: %d %s", a.code, a.body)
	}

	// One audit row per change, with who, how, what and why.
	type auditRow struct {
		RequestID, Action, Actor, Via, Note, Outcome string
		Params                                       json.RawMessage
	}
	rows, err := db.Pool.Query(ctx, `SELECT request_id, action, actor, via, note, outcome, params FROM onceflow.admin_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var audit []auditRow
	for rows.Next() {
		var r auditRow
		if err := rows.Scan(&r.RequestID, &r.Action, &r.Actor, &r.Via, &r.Note, &r.Outcome, &r.Params); err != nil {
			t.Fatal(err)
		}
		audit = append(audit, r)
	}
	var got []string
	for _, r := range audit {
		got = append(got, r.RequestID+":"+r.Action+":"+r.Outcome)
		wantNote := r.RequestID != "req-one" && r.RequestID != "req-none" // replaying one event needs no note
		if r.Actor != "alice" || r.Via != "api:oncall" || (r.Note != "") != wantNote {
			t.Errorf("audit row %+v: want actor alice via api:oncall and a note (%v)", r, wantNote)
		}
	}
	want := "req-early:dlq.replay:partial req-billing:dlq.replay:ok req-email:dlq.replay:ok req-one:dlq.replay:ok " +
		"req-none:dlq.replay:rejected req-stale:dlq.replay:rejected " +
		"req-gap:gap.resolve:ok req-nogap:gap.resolve:rejected req-giveup:gap.give_up:rejected"
	if strings.Join(got, " ") != want {
		t.Errorf("audit rows:\n got %s\nwant %s", strings.Join(got, " "), want)
	}
	if !strings.Contains(string(audit[1].Params), gb.ID) {
		t.Errorf("audit params of the billing replay: %s", audit[1].Params)
	}
	var auditAPI struct{ Audit []console.AuditEntry }
	api.get("/api/v1/audit?limit=50", &auditAPI)
	if len(auditAPI.Audit) != len(audit) || auditAPI.Audit[0].RequestID != "req-giveup" || strings.Contains(string(auditAPI.Audit[len(audit)-2].Result), `"events"`) {
		t.Errorf("audit API: %d rows, newest %+v", len(auditAPI.Audit), auditAPI.Audit[0])
	}

	// Lag: caught up, then three records behind.
	var lag console.LagReport
	api.get("/api/v1/lag", &lag)
	if lag.KafkaError != "" || len(lag.Partitions) != 2 || lag.Total != 0 {
		t.Errorf("lag when caught up: %+v", lag)
	}
	produce(t, cl, topic, typedEvents("fine-2", "audit.log", 1, 3)...)
	api.get("/api/v1/lag", &lag)
	if lag.Total != 3 {
		t.Errorf("lag after 3 more records: %+v", lag)
	}
	for _, p := range lag.Partitions {
		if p.StoredNextOffset == nil || p.EndOffset == nil || p.Lag == nil || *p.Lag != *p.EndOffset-*p.StoredNextOffset {
			t.Errorf("partition lag %+v", p)
		}
	}

	// Relay status: read through onceflow.relay_status().
	var rs console.RelayStatus
	api.get("/api/v1/relay", &rs)
	if rs.PendingRows != 0 || rs.Leader != "" || len(rs.Leases) != 0 || rs.SetAside == nil || rs.SetAside.Count != 0 || len(rs.SetAside.Rows) != 0 {
		t.Errorf("relay status, empty: %+v", rs)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT onceflow.enqueue('t', 'relay-src', 'x.y', '{}'::jsonb)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.relay_lease (shard, holder, expires_at) VALUES ('default', 'relay-a', now() + interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	// A row Kafka refused (open, listed) and one already skipped (resolved,
	// not listed), as the relay and `relay outbox failed skip` leave them.
	if _, err := db.Pool.Exec(ctx, `INSERT INTO onceflow.outbox_set_aside (outbox_id, event_id, topic, source, seq, event_type, reason, error, resolved_at, resolution)
		VALUES (41, 'ev-41', 't', 'relay-src', 7, 'x.y', 'too_large', 'MESSAGE_TOO_LARGE: the message is larger than the topic allows', NULL, NULL),
		       (40, 'ev-40', 'bad topic!', 'relay-src', 6, 'x.y', 'invalid_topic', 'INVALID_TOPIC_EXCEPTION', now(), 'skipped')`); err != nil {
		t.Fatal(err)
	}
	api.get("/api/v1/relay", &rs)
	if rs.PendingRows != 1 || rs.Leader != "relay-a" || len(rs.Leases) != 1 || rs.Leases[0].Shards != 1 || rs.OldestUnpublishedAt == nil {
		t.Errorf("relay status: %+v", rs)
	}
	if sa := rs.SetAside; sa == nil || sa.Count != 1 || len(sa.Rows) != 1 || sa.Oldest == nil {
		t.Errorf("relay status, set aside: %+v", sa)
	} else if r := sa.Rows[0]; r.OutboxID != 41 || r.Source != "relay-src" || r.Seq != 7 || r.Topic != "t" || r.Reason != "too_large" ||
		!strings.Contains(r.Error, "MESSAGE_TOO_LARGE") || r.SetAsideAt.IsZero() || r.RetryAt != nil {
		t.Errorf("relay status, set-aside row: %+v", r)
	}

	// A snapshot held in the database shows in the summary.
	holder, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT count(*) FROM onceflow.outbox`); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `SELECT pg_sleep(0.2)`); err != nil {
		t.Fatal(err)
	}
	var sum console.Summary
	api.get("/api/v1/summary", &sum)
	if sum.Dead != 0 || sum.Held != 1 || sum.OpenGaps != 1 || sum.GivenUpUnresolved != int64(states["given_up"]-1) || sum.Parked != 1 {
		t.Errorf("summary: %+v", sum)
	}
	if sum.CleanupHolder != "transaction" || sum.CleanupHeldSeconds < 0.2 {
		t.Errorf("summary: cleanup held back by %q for %vs, want a transaction for at least 0.2s", sum.CleanupHolder, sum.CleanupHeldSeconds)
	}
	if strings.Contains(logs.buf.String(), token) {
		t.Error("the token reached the log")
	}
}

func ptr[T any](v T) *T { return &v }
