package itest

import (
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestRelaySkipGapGivenUp: an operator's `relay outbox failed skip` ends,
// on the consumer's side, in a loud gap, closed at once by the command the
// skip prints. Source src-skip writes seqs 1–4;
// seq 2 is 150 KiB on a topic whose max.message.bytes is 64 KiB, so the
// relay binary sets it aside and holds src-skip back while src-ok (seqs 1–4)
// flows through a real broker to an in-process consumer engine (gap timeout
// an hour for the class). After the skip, src-skip's seqs 3 and 4 are
// published and parked behind the gap 2–2; the skip's output names the
// `consumer gaps give-up` command for the stream, which the operator runs:
// the consumer gives the gap up at its next check (one seq_gaps row given_up
// by the operator, the given-up counter at 1, one ERROR line naming the
// source and range) and applies 3 and 4 after 1. A fifth event of each
// source then flows as usual.
// giveUpHint is the command `relay outbox failed skip` prints.
var giveUpHint = regexp.MustCompile(`consumer gaps give-up (\S+) (\S+) -producer (\S+) -topic (\S+) -note (".*")`)

func TestRelaySkipGapGivenUp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	e := newRelayEnv(t, 2)
	e.topic = testkit.Topic(t, "skip-gap", 2, map[string]*string{"max.message.bytes": testkit.StringPtr("65536")})
	if _, err := e.db.Pool.Exec(ctx, appliedTable); err != nil {
		t.Fatal(err)
	}
	// Random, so that compression cannot bring it under the limit.
	noise := make([]byte, 150<<10)
	_, _ = crand.Read(noise)
	big := []byte(`{"blob":"` + base64.StdEncoding.EncodeToString(noise) + `"}`)
	enqueue := func(source string, payload []byte) {
		t.Helper()
		err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: e.topic, Source: source, EventType: "test.event", Payload: payload})
			return err
		})
		if err != nil {
			t.Fatalf("enqueue %s: %v", source, err)
		}
	}
	for seq := 1; seq <= 4; seq++ {
		enqueue("src-ok", []byte(`{}`))
		if seq == 2 {
			enqueue("src-skip", big)
		} else {
			enqueue("src-skip", []byte(`{}`))
		}
	}

	var logs logBuf
	c := startEngine(t, inbox.Config{Pool: e.db.Pool, Group: "g-" + e.topic, Topics: []string{e.topic},
		BatchHandler: seqHandler(t), Logger: logs.logger(),
		GapTimeout: time.Hour, GapTimeouts: []inbox.GapTimeout{{Pattern: "test.*", Timeout: 2 * time.Hour}},
		GapCheckInterval: 50 * time.Millisecond})
	relay := e.start("relay", nil, "-holder-id", "skip-gap")
	t0 := time.Now()

	var setAside int64
	eventually(t, 90*time.Second, "src-skip's seq 2 set aside, src-ok applied, src-skip held after 1", func() (bool, string) {
		var reason string
		err := e.db.Pool.QueryRow(ctx, `SELECT outbox_id, reason FROM onceflow.outbox_set_aside WHERE source = 'src-skip' AND resolved_at IS NULL`).Scan(&setAside, &reason)
		ok, skip := appliedOrder(t, e.db, "src-ok"), appliedOrder(t, e.db, "src-skip")
		return err == nil && reason == "too_large" && ok == "1 2 3 4" && skip == "1",
			fmtState("set aside ", reason, " (", err, "), src-ok ", ok, ", src-skip ", skip, "; relay:\n", relay.Output())
	})
	t.Logf("seq 2 set aside and src-ok applied in %s", time.Since(t0).Round(time.Millisecond))
	if g := c.metric("onceflow_consumer_seq_gaps_given_up_total"); g != 0 {
		t.Fatalf("given_up_total %v before the skip, want 0", g)
	}

	out, err := relayCmd(t, e.db, "outbox", "failed", "skip", strconv.FormatInt(setAside, 10), "-note", "payload over the topic's limit, event not needed")
	if err != nil {
		t.Fatalf("skip: %v\n%s", err, out)
	}
	m := giveUpHint.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the skip's output names no consumer gaps give-up command:\n%s", out)
	}
	note, err := strconv.Unquote(m[5])
	if err != nil {
		t.Fatalf("the hint's note %s: %v", m[5], err)
	}
	eventually(t, 60*time.Second, "src-skip's 3 and 4 parked behind the gap 2–2", func() (bool, string) {
		n := count(t, e.db, `SELECT count(*) FROM onceflow.seq_gaps WHERE source = 'src-skip' AND state = 'open' AND from_seq = 2 AND to_seq = 2`)
		return n == 1, fmtState("open gaps 2-2: ", n)
	})
	t1 := time.Now()
	cons := testkit.Binary(t, "consumer")
	if got := runBin(t, cons, []string{"ONCEFLOW_DATABASE_URL=" + e.db.URL}, "gaps", "give-up", m[1], m[2], "-producer", m[3], "-topic", m[4], "-note", note); !strings.Contains(got, "2-2 to be given up now") {
		t.Fatalf("consumer gaps give-up: %s", got)
	}
	eventually(t, 60*time.Second, "the gap 2–2 given up and src-skip's 3 and 4 applied", func() (bool, string) {
		skip, g := appliedOrder(t, e.db, "src-skip"), c.metric("onceflow_consumer_seq_gaps_given_up_total")
		return skip == "1 3 4" && g == 1, fmtState("src-skip ", skip, ", given_up_total ", g)
	})
	t.Logf("after the skip, the gap was given up and 3–4 applied in %s", time.Since(t1).Round(time.Millisecond))
	var from, to int64
	var reason string
	if err := e.db.Pool.QueryRow(ctx, `SELECT from_seq, to_seq, give_up_reason FROM onceflow.seq_gaps WHERE source = 'src-skip' AND state = 'given_up'`).Scan(&from, &to, &reason); err != nil ||
		from != 2 || to != 2 || reason != "operator" {
		t.Fatalf("given-up gap of src-skip: %d–%d %q %v, want 2–2 operator", from, to, reason, err)
	}
	if n := count(t, e.db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`); n != 1 {
		t.Fatalf("%d given-up gaps, want 1", n)
	}
	if l := logs.lines(givenUpMsg, `"source":"src-skip"`, `"range":"2-2"`); len(l) != 1 {
		t.Fatalf("%d give-up ERROR lines for src-skip 2, want 1:\n%s", len(l), strings.Join(logs.lines(`"level":"ERROR"`), "\n"))
	}

	// Both sources keep flowing.
	enqueue("src-ok", []byte(`{}`))
	enqueue("src-skip", []byte(`{}`))
	eventually(t, 60*time.Second, "a fifth event of each source applied", func() (bool, string) {
		ok, skip := appliedOrder(t, e.db, "src-ok"), appliedOrder(t, e.db, "src-skip")
		return ok == "1 2 3 4 5" && skip == "1 3 4 5", fmtState("src-ok ", ok, ", src-skip ", skip)
	})
	if g := c.metric("onceflow_consumer_seq_gaps_given_up_total"); g != 1 {
		t.Fatalf("given_up_total %v at the end, want 1", g)
	}
	c.stop(t)
}
