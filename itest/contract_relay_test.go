package itest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/internal/topics"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// TestContractRelayTopicsSubcommand runs `relay topics verify|apply` from the
// real binary: drift exits 1 naming the topic, apply creates it, verify then
// exits 0, and a bad flag exits 2.
func TestContractRelayTopicsSubcommand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	bin := testkit.Binary(t, "relay")
	evt := entry(uniqueName(t, "bin-evt"), topics.RoleEvents)
	evt.ReplicationFactor, evt.MinInsyncReplicas = 3, 2
	path := filepath.Join(t.TempDir(), "topics.json")
	b, _ := json.Marshal(topics.Spec{Format: topics.SpecFormat, Topics: []topics.TopicSpec{evt}})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	relay := func(args ...string) (string, int) {
		cmd := exec.CommandContext(ctx, bin, append([]string{"topics"}, args...)...)
		cmd.Env = append(os.Environ(),
			"ONCEFLOW_KAFKA_BROKERS="+testkit.KafkaBrokers(t),
			"ONCEFLOW_TOPICS_SPEC="+path,
			"ONCEFLOW_TOPICS_REPLICATION_FACTOR=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return out.String(), 0
		case errors.As(err, &ee):
			return out.String(), ee.ExitCode()
		default:
			t.Fatalf("run relay topics %v: %v", args, err)
			return "", -1
		}
	}
	if out, code := relay("verify"); code != 1 || !strings.Contains(out, `drift: topic "`+evt.Name+`": missing`) {
		t.Fatalf("relay topics verify before apply: exit %d, want 1 naming the missing topic\n%s", code, out)
	}
	if out, code := relay("apply"); code != 0 || !strings.Contains(out, `created: topic "`+evt.Name+`"`) {
		t.Fatalf("relay topics apply: exit %d\n%s", code, out)
	}
	if out, code := relay("verify"); code != 0 {
		t.Fatalf("relay topics verify after apply: exit %d\n%s", code, out)
	}
	if out, code := relay("verify", "-topics-replication-factor", "-1"); code != 2 || !strings.Contains(out, "-topics-replication-factor") {
		t.Fatalf("relay topics verify with a bad flag: exit %d, want 2 naming the flag\n%s", code, out)
	}
}

// TestContractRelayPublishes runs the real relay binary, killed once with
// SIGKILL and restarted, on events enqueued through the outbox, then reads
// the topic with kcat (read_committed): every record is valid against
// contract/envelope.schema.json, keyed by its source, and the reference
// consumer applies exactly the committed outbox events, once each, every
// source in seq order.
func TestContractRelayPublishes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	env := newRelayEnv(t, 3)
	schema := envelopeSchema(t)

	enqueue := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			msg := outbox.Message{
				Topic: env.topic, Source: fmt.Sprintf("order-%d", i%4), EventType: "order.updated",
				Payload: fmt.Appendf(nil, `{"n":%d}`, i),
			}
			switch i % 5 {
			case 1:
				msg.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
			case 2:
				msg.Headers = map[string]string{"tenant": "acme"}
			case 3:
				msg.ContentType, msg.Payload = "text/plain", []byte("not json")
			}
			if err := pgx.BeginFunc(ctx, env.db.Pool, func(tx pgx.Tx) error {
				_, err := outbox.Enqueue(ctx, tx, msg)
				return err
			}); err != nil {
				t.Fatalf("enqueue %d: %v", i, err)
			}
		}
	}
	enqueue(0, 40)
	first := env.start("relay-1", nil)
	waitLeader(t, ctx, first)
	first.Kill()
	enqueue(40, 60)
	second := env.start("relay-2", nil)
	waitLeader(t, ctx, second)
	if err := testkit.WaitDrained(ctx, env.db.Pool, env.topic); err != nil {
		t.Fatalf("outbox not drained: %v", err)
	}

	var want []string
	rows, err := env.db.Pool.Query(ctx, `SELECT event_id FROM onceflow.outbox WHERE topic = $1`, env.topic)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	if rows.Err() != nil || len(want) != 60 {
		t.Fatalf("outbox holds %d events of the topic (%v), want 60", len(want), rows.Err())
	}

	lines := readWithKcat(ctx, t, env.topic)
	for _, line := range lines {
		doc, rec, err := normalize(line)
		if err != nil {
			t.Fatalf("relay record breaks the contract: %v\n%s", err, line)
		}
		if err := schema.Validate(doc); err != nil {
			t.Fatalf("relay record %s/%d@%d is invalid against contract/envelope.schema.json:\n%v\n%s", rec.Topic, rec.Partition, rec.Offset, err, line)
		}
		if hs := doc["headers"].(map[string]any); doc["key"] != hs["source"] {
			t.Fatalf("relay record key %v is not its source %v", doc["key"], hs["source"])
		}
	}
	applied, summary := runReferenceConsumer(ctx, t, lines)
	var got []string
	next := map[string]int64{}
	for _, a := range applied {
		got = append(got, a.EventID)
		if a.Seq != next[a.Source]+1 {
			t.Errorf("reference consumer applied %s seq %d after seq %d", a.Source, a.Seq, next[a.Source])
		}
		next[a.Source] = a.Seq
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("reference consumer applied %d events, want the %d committed outbox events once each", len(got), len(want))
	}
	if len(summary.Gaps) != 0 {
		t.Fatalf("reference consumer left gaps: %v", summary.Gaps)
	}
	t.Logf("%d records read with kcat, %d events applied, %d duplicates skipped", len(lines), len(applied), summary.Duplicates)
}

// TestContractRelayTopicsVerify runs the real relay with -topics-verify: it
// refuses to start on a checkpoint topic that breaks the spec, publishes
// nothing to an event topic that breaks it (its rows are set aside with
// reason topic_contract and tried again; none is skipped), and publishes
// everything once the topic conforms.
func TestContractRelayTopicsVerify(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	db := testkit.NewDB(t)
	evt := entry(uniqueName(t, "verify-evt"), topics.RoleEvents)
	ck := entry(uniqueName(t, "verify-ckpt"), topics.RoleCheckpoint)
	path := filepath.Join(t.TempDir(), "topics.json")
	writeSpec := func(entries ...topics.TopicSpec) {
		t.Helper()
		b, err := json.Marshal(topics.Spec{Format: topics.SpecFormat, Topics: entries})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := topics.Apply(ctx, admin(t), parseSpec(t, evt, ck)); err != nil {
		t.Fatalf("create conforming topics: %v", err)
	}
	visible(ctx, t, evt.Name, ck.Name)
	bin := testkit.Binary(t, "relay")
	start := func(name, checkpoint string) *testkit.Proc {
		return testkit.Start(t, name, bin, nil, "run",
			"-database-url", db.URL, "-kafka-brokers", testkit.KafkaBrokers(t),
			"-checkpoint-topic", checkpoint, "-transactional-id-prefix", "it-verify-"+evt.Name+"-",
			"-http-addr", "127.0.0.1:0", "-backoff-max", "500ms", "-retry-set-aside-after", "300ms",
			"-topics-verify", "-topics-spec", path)
	}

	// A checkpoint topic that breaks the spec (no segment.ms, no
	// compression): the relay does not start.
	badCkpt := testkit.Topic(t, "verify-badckpt", 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")})
	badEntry := ck
	badEntry.Name = badCkpt
	writeSpec(evt, ck, badEntry)
	p := start("relay-badckpt", badCkpt)
	if err := p.Wait(30 * time.Second); err == nil {
		t.Fatal("relay started on a checkpoint topic that breaks the spec")
	}
	if !strings.Contains(p.Output(), "checkpoint topic breaks the topic spec") || !strings.Contains(p.Output(), badCkpt) {
		t.Fatalf("relay's refusal does not name the checkpoint topic:\n%s", p.Output())
	}

	// An event topic with fewer partitions than the spec: nothing published.
	wantMore := evt
	wantMore.Partitions = evt.Partitions * 2
	writeSpec(wantMore, ck)
	for i := range 5 {
		if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			_, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: evt.Name, Source: fmt.Sprintf("s-%d", i%2), EventType: "test.event", Payload: []byte(`{}`)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	relay := start("relay-verify", ck.Name)
	if _, err := relay.WaitFor(ctx, regexp.MustCompile(`"msg":"outbox row set aside.*"topic":"`+regexp.QuoteMeta(evt.Name)+`".*"reason":"topic_contract"`)); err != nil {
		t.Fatal(err)
	}
	var unpublished int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox_pending`).Scan(&unpublished); err != nil {
		t.Fatal(err)
	}
	ends, err := admin(t).ListEndOffsets(ctx, evt.Name)
	if err != nil {
		t.Fatal(err)
	}
	var onTopic int64
	ends.Each(func(o kadm.ListedOffset) { onTopic += o.Offset })
	if unpublished != 5 || onTopic != 0 {
		t.Fatalf("with a drifted topic: %d of 5 rows unpublished, %d records on the topic; want 5 and 0", unpublished, onTopic)
	}

	// The spec and the topic agree again: the same relay publishes all five.
	writeSpec(evt, ck)
	if err := testkit.WaitDrained(ctx, db.Pool, evt.Name); err != nil {
		t.Fatalf("after the topic conforms: %v\n%s", err, relay.Output())
	}
}
