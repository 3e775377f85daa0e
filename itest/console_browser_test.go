package itest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	console "github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// chromium finds a headless-capable Chromium: ONCEFLOW_TEST_CHROMIUM, or
// chromium / chromium-browser / google-chrome on PATH. A missing browser
// fails the test (it is a requirement of `make test`, like kcat).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ONCEFLOW_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("the console browser test needs headless Chromium and found none (looked for chromium, chromium-browser, " +
		"google-chrome on PATH): install the Debian package chromium (apt-get install chromium), or set ONCEFLOW_TEST_CHROMIUM to a Chrome binary")
	return ""
}

// artifactDir is where a test keeps files for people to look at after the
// run: $ONCEFLOW_TEST_ARTIFACTS/<test>, else .cache/test-artifacts/<test>
// in the repository (git-ignored).
func artifactDir(t *testing.T) string {
	t.Helper()
	base := os.Getenv("ONCEFLOW_TEST_ARTIFACTS")
	if base == "" {
		root, err := testkit.RepoRoot()
		if err != nil {
			t.Fatal(err)
		}
		base = filepath.Join(root, ".cache", "test-artifacts")
	}
	dir := filepath.Join(base, t.Name())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

var replayedText = regexp.MustCompile(`(\d+) replayed, (\d+) replayed late`)

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

var adminListening = regexp.MustCompile(`"msg":"admin listening".*"addr":"([^"]+)"`)

// TestConsoleBrowser drives the console page in headless Chromium against
// the real consumer binary (admin on, token from a file). The binary
// dead-letters the events of a broken handler (two errors: 20 billing
// events of 4 sources, 6 email events of 2 sources) and keeps one gap
// open. The test signs in with the keyboard, checks the groups, gaps,
// summary, lag and relay panels, fixes the billing handler, opens the
// billing group's replay with the keyboard, waits for the dry-run count in
// the confirmation dialog, writes a note and confirms; then it checks the
// database: each billing event applied once, per source in seq order,
// the email ones still dead, one audit row with the browser's actor name.
// Screenshots of the dialog and the page are kept as artifacts.
func TestConsoleBrowser(t *testing.T) {
	t.Parallel()
	chrome := chromium(t)
	db := consoleDB(t)
	topic := testkit.Topic(t, "console-web", 1, nil)
	cl := testkit.Client(t)
	var evs []envelope.Envelope
	var billing []string
	for i := range 4 {
		src := fmt.Sprintf("acct-%d", i)
		billing = append(billing, src)
		evs = append(evs, typedEvents(src, "billing.charge", 1, 5)...)
	}
	for i := range 2 {
		evs = append(evs, typedEvents(fmt.Sprintf("user-%d", i), "email.send", 1, 3)...)
	}
	evs = append(evs, typedEvents("fine-1", "audit.log", 1, 3)...)
	evs = append(evs, typedEvents("gappy", "audit.log", 1, 1)...)
	evs = append(evs, typedEvents("gappy", "audit.log", 3, 3)...)
	produceAll(t, cl, topic, evs)

	const token = "browser-test-token-7c1e55d0"
	tokenFile := filepath.Join(t.TempDir(), "admin-tokens")
	if err := os.WriteFile(tokenFile, []byte("# console test\noncall "+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testkit.Start(t, "consumer", testkit.Binary(t, "consumer"), []string{
		"ONCEFLOW_DATABASE_URL=" + db.URL,
		"ONCEFLOW_KAFKA_BROKERS=" + testkit.KafkaBrokers(t),
		"ONCEFLOW_GROUP=g-" + topic,
		"ONCEFLOW_TOPICS=" + topic,
		"ONCEFLOW_HANDLERS_FILE=" + consoleHandlersFile(t),
		"ONCEFLOW_HTTP_ADDR=127.0.0.1:0",
		"ONCEFLOW_ADMIN=true",
		"ONCEFLOW_ADMIN_ADDR=127.0.0.1:0",
		"ONCEFLOW_ADMIN_TOKEN_FILE=" + tokenFile,
		"ONCEFLOW_RETRY_MAX_ATTEMPTS=1",
		"ONCEFLOW_GAP_TIMEOUT=10m",
		"ONCEFLOW_GAP_TIMEOUTS=billing.*=300ms,email.*=300ms",
		"ONCEFLOW_GAP_CHECK_INTERVAL=100ms",
	}, "run")
	wctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	line, err := p.WaitFor(wctx, adminListening)
	if err != nil {
		t.Fatalf("admin server: %v\n%s", err, p.Output())
	}
	base := "http://" + adminListening.FindStringSubmatch(line)[1]
	eventually(t, 90*time.Second, "26 dead letters and gappy's seq 3 parked", func() (bool, string) {
		dead := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'dead'`)
		parked := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'parked'`)
		return dead == 26 && parked == 1, fmtState("dead ", dead, ", parked ", parked)
	})
	api := apiClient{t: t, base: base, token: token}
	var groups struct{ Groups []console.Group }
	api.get("/api/v1/dead-letters/groups", &groups)
	var billingID string
	for _, g := range groups.Groups {
		if g.Key == billingKey {
			billingID = g.ID
		}
	}
	if len(groups.Groups) != 2 || billingID == "" {
		t.Fatalf("groups: %+v", groups.Groups)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome),
		chromedp.Flag("headless", true),
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 1100),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	defer cancelBrowser()
	bctx, cancelTimeout := context.WithTimeout(bctx, 2*time.Minute)
	defer cancelTimeout()
	artifacts := artifactDir(t)
	fail := func(what string, err error) {
		t.Helper()
		if shot, serr := chromedp.Run(bctx, chromedp.CaptureScreenshot()); serr == nil {
			path := filepath.Join(artifacts, "failure.png")
			_ = os.WriteFile(path, shot, 0o644)
			t.Logf("screenshot at the failure: %s", path)
		}
		t.Fatalf("%s: %v", what, err)
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, steps...); err != nil {
			fail(what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.TextContent(chromedp.CSS(sel)))
		if err != nil {
			fail("read "+sel, err)
		}
		return s
	}
	evalString := func(expr string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr))
		if err != nil {
			fail("evaluate "+expr, err)
		}
		return s
	}
	waitText := func(sel, want string) {
		t.Helper()
		expr := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return !!e && e.textContent.includes(%q); })()`, sel, want)
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
			fail(fmt.Sprintf("wait for %q in %s (it shows %q)", want, sel, text(sel)), err)
		}
	}
	shoot := func(name string, full bool) {
		t.Helper()
		a := chromedp.CaptureScreenshot()
		if full {
			a = chromedp.FullScreenshot(100)
		}
		b, err := chromedp.Run(bctx, a)
		if err != nil {
			fail("screenshot", err)
		}
		path := filepath.Join(artifacts, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", path, len(b))
	}

	// A row the relay set aside (Kafka refused it), for the relay panel.
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO onceflow.outbox_set_aside (outbox_id, event_id, topic, source, seq, event_type, reason, error)
		VALUES (77, 'ev-77', 'orders', 'order-9', 4, 'order.placed', 'too_large', 'MESSAGE_TOO_LARGE (browser test)')`); err != nil {
		t.Fatal(err)
	}

	// Sign in with the keyboard: type the token and the name, press Enter.
	do("open the console", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("token")))
	if f := evalString(`document.activeElement.id`); f != "token" {
		t.Errorf("focus on load is on %q, want the token field", f)
	}
	// A submit the script does not catch (form.submit() fires no submit
	// event) posts the form: the token goes in no URL, and the page comes
	// back (303) with nothing of it in its address or history.
	do("type the token", chromedp.SendKeys(chromedp.ID("token"), token))
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.beforeSubmit = true; document.getElementById("login-form").submit(); true`)); err != nil {
		fail("submit the form past the script", err)
	}
	// The navigation interrupts a running evaluation: ask again until the
	// new page answers.
	for deadline := time.Now().Add(30 * time.Second); ; {
		back, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.beforeSubmit === undefined && document.readyState === "complete" && !!document.getElementById("token")`))
		if err == nil && back {
			break
		}
		if time.Now().After(deadline) {
			fail("wait for the page after the submit", err)
		}
		time.Sleep(100 * time.Millisecond) // polling the page
	}
	if u := evalString(`location.href + " " + history.length`); strings.Contains(u, token) || !strings.HasPrefix(u, base+"/ ") {
		t.Errorf("after a programmatic submit the page is at %q: want %s/ without the token", u, base)
	}
	do("wait for the sign-in form", chromedp.WaitVisible(chromedp.ID("token")))
	do("sign in", chromedp.SendKeys(chromedp.ID("token"), token), chromedp.SendKeys(chromedp.ID("actor"), "Dana (browser test)"),
		chromedp.SendKeys(chromedp.ID("actor"), kb.Enter),
		chromedp.WaitVisible(chromedp.CSS(`#groups-table tr[data-group-id]`)))

	// What is shown.
	if n := evalString(`String(document.querySelectorAll('#groups-table tbody tr[data-group-id]').length)`); n != "2" {
		t.Errorf("the page shows %s error groups, want 2", n)
	}
	g := text(`#groups-table tr[data-group-id="` + billingID + `"]`)
	for _, want := range []string{billingKey, "20", "4", "billing.charge"} {
		if !strings.Contains(g, want) {
			t.Errorf("billing group row %q lacks %q", g, want)
		}
	}
	if !strings.Contains(text("#groups-table"), emailKey) {
		t.Errorf("groups table lacks the email group:\n%s", text("#groups-table"))
	}
	gaps := text("#gaps-table")
	for _, want := range []string{"gappy", "open", "given up", "acct-0", "user-1", "Resolve…"} {
		if !strings.Contains(gaps, want) {
			t.Errorf("gaps table lacks %q:\n%s", want, gaps)
		}
	}
	summary := text("#summary-list")
	for _, want := range []string{"Dead letters26", "Open gaps1", "Parked1"} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary %q lacks %q", summary, want)
		}
	}
	if s := text("#relay-list"); !strings.Contains(s, "no relay holds a live lease") || !strings.Contains(s, "1 row waits") {
		t.Errorf("relay panel: %q", s)
	}
	if s := text(`#set-aside-table tr[data-outbox-id="77"]`); !strings.Contains(s, "order-9") || !strings.Contains(s, "too_large") ||
		!strings.Contains(s, "MESSAGE_TOO_LARGE (browser test)") || !strings.Contains(s, "orders") {
		t.Errorf("set-aside row in the relay panel: %q", s)
	}
	waitText("#lag-table", topic)
	if s := text("#who"); !strings.Contains(s, "Dana (browser test)") || !strings.Contains(s, "api:oncall") {
		t.Errorf("signed-in line: %q", s)
	}

	// The fix, then the group replay, opened with the keyboard.
	if _, err := db.Pool.Exec(context.Background(), `DELETE FROM public.broken WHERE event_type = 'billing.charge'`); err != nil {
		t.Fatal(err)
	}
	replayBtn := chromedp.CSS(`button.replay-group[data-group-id="` + billingID + `"]`)
	do("open the replay dialog", chromedp.Focus(replayBtn), chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS("#replay-dialog[open]")))
	waitText("#replay-count", "20 events of 4 sources will be replayed")
	do("confirm enabled", chromedp.WaitEnabled(chromedp.ID("replay-confirm")))
	if f := evalString(`document.activeElement.id`); f != "replay-note" {
		t.Errorf("focus in the dialog is on %q, want the note", f)
	}
	if s := text("#replay-confirm"); s != "Replay 20 events" {
		t.Errorf("confirm button says %q", s)
	}
	// Confirming without a note is refused by the page.
	do("confirm without a note", chromedp.Click(chromedp.ID("replay-confirm")))
	waitText("#replay-error", "Say why")
	if n := count(t, db, `SELECT count(*) FROM onceflow.admin_audit`); n != 0 {
		t.Fatalf("a replay without a note reached the server: %d audit rows", n)
	}
	do("write the note", chromedp.SendKeys(chromedp.ID("replay-note"), "billing handler fixed (browser test)"))
	shoot("replay-dialog.png", false)
	do("confirm", chromedp.Click(chromedp.ID("replay-confirm")))
	waitText("#replay-result", "Done")
	if m := replayedText.FindStringSubmatch(text("#replay-result")); m == nil || atoi(m[1])+atoi(m[2]) != 20 {
		t.Errorf("replay result: %q, want 20 replayed (in order or late)", text("#replay-result"))
	}
	do("close the dialog", chromedp.Click(chromedp.ID("replay-cancel")), chromedp.WaitNotPresent(chromedp.CSS("#replay-dialog[open]")))
	// The page refreshes itself: the billing group is gone, the change is
	// in the audit panel.
	do("groups refreshed", chromedp.WaitNotPresent(chromedp.CSS(`#groups-table tr[data-group-id="`+billingID+`"]`)))
	waitText("#audit-table", "Dana (browser test)")

	// Resolve acct-0's given-up gap, by keyboard only: the row's button,
	// Enter, type the note, Tab to the Resolve button, Enter.
	resolveBtn := chromedp.CSS(`#gaps-table tr[data-source="acct-0"][data-state="given_up"] button`)
	do("open the resolve dialog", chromedp.Focus(resolveBtn), chromedp.KeyEvent(kb.Enter), chromedp.WaitVisible(chromedp.CSS("#resolve-dialog[open]")))
	do("resolve", chromedp.SendKeys(chromedp.ID("resolve-note"), "seq 1 replayed late after the fix"), chromedp.KeyEvent(kb.Tab))
	if f := evalString(`document.activeElement.id`); f != "resolve-confirm" {
		t.Errorf("Tab from the note goes to %q, want the Resolve button", f)
	}
	do("confirm resolve", chromedp.KeyEvent(kb.Enter), chromedp.WaitNotPresent(chromedp.CSS("#resolve-dialog[open]")))
	waitText(`#gaps-table tr[data-source="acct-0"][data-state="given_up"]`, "seq 1 replayed late after the fix")
	shoot("console.png", true)

	// The database: applied once each, in seq order per source; the email
	// events still dead; one audit row.
	checkPerSourceOrder(t, db, billing, 5)
	if n := count(t, db, `SELECT count(*) FROM public.applied WHERE source LIKE 'acct-%'`); n != 20 {
		t.Errorf("%d billing events applied, want 20", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE status = 'dead'`); n != 6 {
		t.Errorf("%d dead letters left, want the 6 email events", n)
	}
	if n := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE source = 'acct-0' AND resolved_note = 'seq 1 replayed late after the fix'`); n != 1 {
		t.Errorf("acct-0's gap resolved %d times, want 1", n)
	}
	var actor, via, note, outcome, action string
	if err := db.Pool.QueryRow(context.Background(), `SELECT actor, via, note, outcome, action FROM onceflow.admin_audit ORDER BY id LIMIT 1`).
		Scan(&actor, &via, &note, &outcome, &action); err != nil {
		t.Fatalf("audit row: %v", err)
	}
	if actor != "Dana (browser test)" || via != "api:oncall" || note != "billing handler fixed (browser test)" || outcome != "ok" || action != "dlq.replay" {
		t.Errorf("audit row: %s %s %q %s %s", actor, via, note, outcome, action)
	}
	if got := count(t, db, `SELECT count(*) FROM onceflow.admin_audit WHERE action = 'gap.resolve' AND actor = 'Dana (browser test)'`); got != 1 {
		t.Errorf("%d audit rows of the gap resolve, want 1", got)
	}
	if strings.Contains(p.Output(), token) {
		t.Error("the token appears in the consumer's output")
	}

	// The command does the same for the email group: fix, replay with an
	// expected count and a request id; the same id again prints the stored
	// result and changes nothing.
	var emailID string
	for _, g := range groups.Groups {
		if g.Key == emailKey {
			emailID = g.ID
		}
	}
	if _, err := db.Pool.Exec(context.Background(), `DELETE FROM public.broken`); err != nil {
		t.Fatal(err)
	}
	bin := testkit.Binary(t, "consumer")
	env := []string{"ONCEFLOW_DATABASE_URL=" + db.URL, "ONCEFLOW_HANDLERS_FILE=" + consoleHandlersFile(t)}
	args := []string{"dlq", "replay", "-error-group", emailID, "-expect", "6", "-note", "smtp back (cli)", "-request-id", "cli-email-1", "-actor", "erin"}
	out := runBin(t, bin, env, args...)
	if m := regexp.MustCompile(`replayed (\d+), replayed late (\d+), parked 0, already processed 0, failed 0, skipped 0`).FindStringSubmatch(out); m == nil ||
		atoi(m[1])+atoi(m[2]) != 6 || !strings.Contains(out, "matched 6 event(s) of 2 source(s)") {
		t.Errorf("dlq replay -group:\n%s", out)
	}
	if again := runBin(t, bin, env, args...); !strings.Contains(again, "already used") {
		t.Errorf("dlq replay with the same -request-id:\n%s", again)
	}
	checkPerSourceOrder(t, db, []string{"user-0", "user-1"}, 3)
	if n := count(t, db, `SELECT count(*) FROM onceflow.admin_audit WHERE request_id = 'cli-email-1' AND via = 'cli' AND actor = 'erin'`); n != 1 {
		t.Errorf("%d audit rows of the command's replay, want 1", n)
	}
}
