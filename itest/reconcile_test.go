package itest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	console "github.com/onceflow/onceflow/internal/admin"
	"github.com/onceflow/onceflow/internal/reconcile"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestReconcileFabricatedHistories: one database (producer and consumer),
// a real relay and a real consumer, two topics. The clean topic's history
// is left alone: reconcile must report nothing. On the other topic each
// source carries one fabricated anomaly, and reconcile must find each one,
// on its stream, and nothing else:
//
//	deleted    an outbox row deleted after it was published   published_never_committed 2
//	phantom    a record with this database's producer header,
//	           never in any outbox                            published_never_committed 1
//	lost       an outbox row taken off the relay's queue and
//	           logged as published, never produced            committed_not_published 1
//	reorder    records produced 1, 3, 2                       out_of_order 2
//	doubled    a second applied inbox row for seq 2           applied_twice 2
//	unapplied  the inbox row of seq 3 deleted                 published_not_applied 3
//	gap        seq 2 deleted before the relay saw it; the
//	           consumer gives the gap up                      gap_given_up 2 (skipped: nowhere)
//
// With -max-ranges below what the window needs, the run stops
// (ErrTooLarge) instead of growing. The same through the binary: exit
// status 0 on the clean topic, 1 on the
// other (and the run recorded, which the console's GET /api/v1/reconcile
// shows), 2 when a topic does not exist.
func TestReconcileFabricatedHistories(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	db := consumerDB(t)
	clean := testkit.Topic(t, "reconcile-clean", 2, nil)
	anom := testkit.Topic(t, "reconcile-anom", 2, nil)
	ckpt := testkit.Topic(t, "reconcile-ckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	bin := testkit.Binary(t, "consumer") // built once per test process
	start := time.Now()

	enqueueN(ctx, t, db, clean, "clean:", []string{"c1", "c2"}, 3)
	enqueueN(ctx, t, db, anom, "anom:", []string{"deleted", "doubled", "unapplied"}, 3)
	do := func(tx pgx.Tx, sql string, args ...any) error {
		_, err := tx.Exec(ctx, sql, args...)
		return err
	}
	// gap: seq 2 is gone before the relay can see it.
	// lost: off the queue and in the publish log, never produced.
	// reorder: off the queue; its records are produced below, 1, 3, 2.
	for _, src := range []string{"gap", "lost", "reorder"} {
		n := map[string]int{"gap": 3, "lost": 1, "reorder": 3}[src]
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			for i := range n {
				if _, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: anom, Source: src, EventType: "order.updated",
					EventID: fmt.Sprintf("anom:%s:%d", src, i+1), Payload: []byte(`{}`)}); err != nil {
					return err
				}
			}
			if src == "gap" {
				return do(tx, `DELETE FROM onceflow.outbox WHERE topic = $1 AND source = 'gap' AND seq = 2`, anom)
			}
			if err := do(tx, `DELETE FROM onceflow.outbox_pending p USING onceflow.outbox o
			                     WHERE p.id = o.id AND o.topic = $1 AND o.source = $2`, anom, src); err != nil {
				return err
			}
			return do(tx, `INSERT INTO onceflow.outbox_published (first_id, last_id, ids)
			                 SELECT min(id), max(id), array_agg(id ORDER BY id) FROM onceflow.outbox WHERE topic = $1 AND source = $2`, anom, src)
		})
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
	}
	producer := drainWithRelay(ctx, t, "reconcile-relay", db, ckpt, clean, anom)
	cl := testkit.Client(t)
	produceRecords(t, cl, streamRecord(producer, anom, "reorder", 1), streamRecord(producer, anom, "reorder", 3),
		streamRecord(producer, anom, "reorder", 2), streamRecord(producer, anom, "phantom", 1))

	group := "g-" + anom
	e := startEngine(t, inbox.Config{Pool: db.Pool, Group: group, Topics: []string{clean, anom}, BatchHandler: sqlHandler(t),
		GapTimeout: time.Second, GapCheckInterval: 100 * time.Millisecond})
	const applied = 6 + 9 + 2 + 3 + 1 // clean, deleted/doubled/unapplied, gap 1 and 3, reorder, phantom
	eventually(t, 60*time.Second, "every event applied and the gap given up", func() (bool, string) {
		n := count(t, db, `SELECT count(*) FROM public.effects`)
		g := count(t, db, `SELECT count(*) FROM onceflow.seq_gaps WHERE state = 'given_up'`)
		return n == applied && g == 1, fmtState(n, " of ", applied, " applied, ", g, " gaps given up")
	})
	e.stop(t)
	t.Logf("relay and consumer done in %s", time.Since(start).Round(time.Millisecond))

	cfg := reconcile.Config{ConsumerPool: db.Pool, OutboxPool: db.Pool, Consumer: inbox.DefaultConsumerName, Group: group,
		KafkaOpts: []kgo.Opt{kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(t), ",")...)},
		From:      start.Add(-time.Minute), Settle: -1, Topics: []string{clean}}
	rep, err := reconcile.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("reconcile %s: %v", clean, err)
	}
	if c := rep.Counts; len(rep.Findings) != 0 || c.Committed != 6 || c.Records != 6 || c.Applied != 6 || c.Streams != 2 {
		t.Fatalf("clean topic: %d findings %+v, counts %+v; want none, 6 committed, read and applied on 2 streams", len(rep.Findings), rep.Findings, c)
	}

	// The anomalies made after the fact.
	for _, q := range []string{
		`DELETE FROM onceflow.outbox WHERE topic = $1 AND source = 'deleted' AND seq = 2`,
		`INSERT INTO onceflow.inbox (consumer, event_id, producer, source, seq, event_type, topic, kafka_partition, kafka_offset, status, processed_at)
		 SELECT consumer, 'doubled-copy', producer, source, seq, event_type, topic, kafka_partition, kafka_offset, status, now()
		   FROM onceflow.inbox WHERE topic = $1 AND source = 'doubled' AND seq = 2`,
		`DELETE FROM onceflow.inbox WHERE topic = $1 AND source = 'unapplied' AND seq = 3`,
	} {
		if tag, err := db.Pool.Exec(ctx, q, anom); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("%s: %v (%d rows)", q, err, tag.RowsAffected())
		}
	}
	want := []string{
		"deleted published_never_committed 2",
		"doubled applied_twice 2",
		"gap gap_given_up 2",
		"lost committed_not_published 1",
		"phantom published_never_committed 1",
		"reorder out_of_order 2",
		"unapplied published_not_applied 3",
	}
	check := func(name string, rep *reconcile.Report) {
		t.Helper()
		var got []string
		for _, f := range rep.Findings {
			got = append(got, fmt.Sprintf("%s %s %s", f.Source, f.Kind, rangesOf(f.Seqs)))
			if f.Topic != anom || f.Producer != producer {
				t.Errorf("%s: finding on stream (%s, %s, %s), want producer %s, topic %s", name, f.Producer, f.Topic, f.Source, producer, anom)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) || rep.Anomalies != len(want) {
			t.Errorf("%s: findings (%d anomalies):\n  %s\nwant:\n  %s", name, rep.Anomalies, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		for _, f := range rep.Findings {
			switch f.Source {
			case "gap":
				if !strings.Contains(f.Detail, "0 on the topic, 0 applied later, 0 in the outbox, 0 skipped by an operator") {
					t.Errorf("%s: gap detail %q", name, f.Detail)
				}
			case "lost":
				if !strings.Contains(f.Detail, "the publish log names 1 of them") {
					t.Errorf("%s: lost detail %q", name, f.Detail)
				}
			}
		}
	}
	cfg.Topics = []string{anom}
	rep, err = reconcile.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("reconcile %s: %v", anom, err)
	}
	check("time window", rep)
	var text strings.Builder
	if err := reconcile.WriteText(&text, rep); err != nil || !strings.Contains(text.String(), "7 anomalies") {
		t.Errorf("the summary: %v\n%s", err, text.String())
	}
	t.Logf("the summary:\n%s", text.String())
	cfg.From, cfg.FromID = time.Time{}, 1
	if rep, err = reconcile.Run(ctx, cfg); err != nil {
		t.Fatalf("reconcile %s by id: %v", anom, err)
	}
	check("id range", rep)
	// -consumer-only (a relay with -delete-on-publish): no producer-side
	// findings, the rest as before.
	only := cfg
	only.ConsumerOnly = true
	if rep, err = reconcile.Run(ctx, only); err != nil {
		t.Fatalf("reconcile %s, consumer only: %v", anom, err)
	}
	var kinds []string
	for _, f := range rep.Findings {
		kinds = append(kinds, f.Source+" "+f.Kind)
	}
	if wantOnly := []string{"doubled applied_twice", "gap gap_given_up", "reorder out_of_order", "unapplied published_not_applied"}; !slices.Equal(kinds, wantOnly) {
		t.Errorf("consumer only: %v, want %v", kinds, wantOnly)
	}
	// ProducerOnly (`relay reconcile`): no consumer read, the producer's
	// findings alone.
	wantProducer := []string{"deleted published_never_committed", "lost committed_not_published", "phantom published_never_committed", "reorder out_of_order"}
	prod := cfg
	prod.ProducerOnly, prod.ConsumerPool, prod.Consumer, prod.Group = true, nil, "", ""
	if rep, err = reconcile.Run(ctx, prod); err != nil {
		t.Fatalf("reconcile %s, producer only: %v", anom, err)
	}
	kinds = nil
	for _, f := range rep.Findings {
		kinds = append(kinds, f.Source+" "+f.Kind)
	}
	slices.Sort(kinds)
	if !slices.Equal(kinds, wantProducer) || rep.Counts.Applied != 0 {
		t.Errorf("producer only: %v (%d inbox rows read), want %v and no inbox read", kinds, rep.Counts.Applied, wantProducer)
	}
	small := cfg
	small.MaxRanges = 100 // under the 7 streams' cost: the run stops instead of growing
	if _, err := reconcile.Run(ctx, small); !errors.Is(err, reconcile.ErrTooLarge) {
		t.Errorf("reconcile with -max-ranges 100: %v, want ErrTooLarge", err)
	}

	// The binary: exit status and JSON, and the run recorded.
	t.Logf("history made and judged in %s", time.Since(start).Round(time.Millisecond))
	runBin := func(topic string) (int, string, string) {
		cmd := exec.CommandContext(ctx, bin, "reconcile", "-database-url", db.URL, "-kafka-brokers", testkit.KafkaBrokers(t), "-group", group,
			"-topics", topic, "-since", "10m", "-settle", "0", "-json")
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("consumer reconcile: %v", err)
		}
		return cmd.ProcessState.ExitCode(), out.String(), errb.String()
	}
	if code, out, errs := runBin(clean); code != 0 {
		t.Errorf("consumer reconcile -topics %s: exit %d, want 0\n%s%s", clean, code, out, errs)
	}
	code, out, errs := runBin(anom)
	var jrep reconcile.Report
	if err := json.Unmarshal([]byte(out), &jrep); err != nil || code != 1 || jrep.Anomalies != len(want) {
		t.Errorf("consumer reconcile -topics %s: exit %d (want 1), %v anomalies in its JSON (want %d), %v\n%s%s", anom, code, jrep.Anomalies, len(want), err, out, errs)
	}
	last, err := reconcile.Last(ctx, db.Pool, inbox.DefaultConsumerName)
	if err != nil || last == nil || last.Status != "anomalies" || last.Anomalies != len(want) || !slices.Equal(last.Topics, []string{anom}) {
		t.Errorf("last recorded run: %+v, %v; want the anomalies run of %s", last, err, anom)
	}
	// The console shows the last run.
	svc, err := console.NewService(console.Config{Pool: db.Pool})
	if err != nil {
		t.Fatal(err)
	}
	const token = "reconcile-test-token-0123456789"
	toks, err := console.ParseTokens([]byte(token))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(console.NewHandler(svc, toks, nil))
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/reconcile", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Last *struct {
			Status string           `json:"status"`
			Report reconcile.Report `json:"report"`
		} `json:"last"`
	}
	err = json.NewDecoder(resp.Body).Decode(&page)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || page.Last == nil || page.Last.Status != "anomalies" || len(page.Last.Report.Findings) != len(want) {
		t.Errorf("GET /api/v1/reconcile: %d, %v, %+v; want the anomalies run with %d findings", resp.StatusCode, err, page.Last, len(want))
	}
	// relay reconcile: the same history from the relay's side.
	relayBin := testkit.Binary(t, "relay")
	for _, tc := range []struct {
		topic string
		code  int
		kinds []string
	}{{clean, 0, nil}, {anom, 1, wantProducer}} {
		cmd := exec.CommandContext(ctx, relayBin, "reconcile", "-database-url", db.URL, "-kafka-brokers", testkit.KafkaBrokers(t),
			"-topics", tc.topic, "-since", "10m", "-settle", "0", "-json")
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = cmd.Run()
		var rrep reconcile.Report
		err := json.Unmarshal([]byte(out.String()), &rrep)
		var got []string
		for _, f := range rrep.Findings {
			got = append(got, f.Source+" "+f.Kind)
		}
		slices.Sort(got)
		if code := cmd.ProcessState.ExitCode(); code != tc.code || err != nil || !rrep.ProducerOnly || !slices.Equal(got, tc.kinds) {
			t.Errorf("relay reconcile -topics %s: exit %d (want %d), findings %v (want %v), %v\n%s%s", tc.topic, code, tc.code, got, tc.kinds, err, out.String(), errb.String())
		}
	}
	if code, _, errs := runBin("reconcile-no-such-topic"); code != 2 || !strings.Contains(errs, "reconcile could not run") || !strings.Contains(errs, "reconcile-no-such-topic") {
		t.Errorf("consumer reconcile on a missing topic: exit %d (want 2), stderr %q (want it to name the topic)", code, errs)
	}
	t.Logf("22 events committed, 4 records produced by hand; 7 fabricated anomalies found, each on its stream, none on the clean topic; took %s",
		time.Since(start).Round(time.Millisecond))
}

func rangesOf(rs []reconcile.Range) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}
