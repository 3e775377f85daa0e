package itest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/internal/topics"
)

// entry is one topic spec entry with the settings these tests start from;
// each test changes what it needs.
func entry(name string, role topics.Role) topics.TopicSpec {
	e := topics.TopicSpec{
		Name: name, Role: role, Partitions: 3, ReplicationFactor: 1, MinInsyncReplicas: 1,
		RetentionMs: 604800000, CleanupPolicy: "delete", Compression: "zstd",
		Configs: map[string]string{"max.message.bytes": "2097152"},
	}
	if role == topics.RoleCheckpoint {
		e.Partitions, e.CleanupPolicy, e.RetentionMs = 1, "compact", -1
		e.Configs = map[string]string{"segment.ms": "3600000"}
	}
	return e
}

// parseSpec round-trips entries through the file format, so the tests use
// specs exactly as a file would give them.
func parseSpec(t *testing.T, entries ...topics.TopicSpec) *topics.Spec {
	t.Helper()
	b, err := json.Marshal(topics.Spec{Format: topics.SpecFormat, Topics: entries})
	if err != nil {
		t.Fatal(err)
	}
	s, err := topics.Parse(b)
	if err != nil {
		t.Fatalf("test spec does not parse: %v", err)
	}
	return s
}

// configsOf is the topic configs of e as a create request wants them.
func configsOf(e topics.TopicSpec) map[string]*string {
	m := map[string]*string{}
	for k, v := range e.WantConfigs() {
		m[k] = kadm.StringPtr(v)
	}
	return m
}

func admin(t *testing.T) *kadm.Client {
	t.Helper()
	return kadm.NewClient(testkit.Client(t))
}

// uniqueName is a topic name for this test that is deleted when it ends,
// whoever creates it (the test or Apply).
func uniqueName(t *testing.T, prefix string) string {
	t.Helper()
	name := prefix + "-" + strings.NewReplacer("/", "_", "#", "_").Replace(t.Name())
	name = strings.ToLower(name) + "-" + time.Now().Format("150405.000000")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin(t).DeleteTopics(ctx, name)
	})
	return name
}

// visible waits until every named topic is in the metadata a fresh client
// sees: a topic is announced to the brokers shortly after CreateTopics
// returns, and Verify rightly calls a topic it cannot see missing.
func visible(ctx context.Context, t *testing.T, names ...string) {
	t.Helper()
	adm := admin(t)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		td, err := adm.ListTopics(ctx, names...)
		if err != nil {
			t.Fatalf("list topics: %v", err)
		}
		n := 0
		for _, name := range names {
			if d, ok := td[name]; ok && d.Err == nil && len(d.Partitions) > 0 {
				n++
			}
		}
		if n == len(names) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topics %q not visible: %v", names, ctx.Err())
		case <-time.After(wait):
		}
	}
}

func driftLines(ds []topics.Drift) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.String()
	}
	return out
}

func assertDrifts(t *testing.T, what string, got []topics.Drift, want ...string) {
	t.Helper()
	g := driftLines(got)
	slices.Sort(g)
	slices.Sort(want)
	if !slices.Equal(g, want) {
		t.Fatalf("%s: drift\n  got:  %s\n  want: %s", what, strings.Join(g, "\n        "), strings.Join(want, "\n        "))
	}
}

// TestContractVerifyDrift creates topics that break their spec in one way
// each and checks that Verify names every broken field, and nothing else:
// a missing topic, too few partitions, a compacted event topic, a wrong
// retention, compression and extra config, a checkpoint topic that deletes,
// a replication factor below the spec, and a topic claimed by a pattern.
func TestContractVerifyDrift(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	good := entry(testkit.Topic(t, "good", 3, configsOf(entry("", topics.RoleEvents))), topics.RoleEvents)

	// An event topic with 2 partitions instead of 3, compacted, gzip, one
	// second of retention and the broker's default max.message.bytes.
	evt := entry("", topics.RoleEvents)
	evt.Name = testkit.Topic(t, "evt", 2, map[string]*string{
		"cleanup.policy": kadm.StringPtr("compact"), "compression.type": kadm.StringPtr("gzip"),
		"retention.ms": kadm.StringPtr("1000"),
	})

	// A checkpoint topic that deletes instead of compacting.
	ckp := entry("", topics.RoleCheckpoint)
	wrongCkp := ckp
	wrongCkp.CleanupPolicy = "delete"
	ckp.Name = testkit.Topic(t, "ckp", 1, configsOf(wrongCkp))

	// A topic fine except that the spec wants two replicas.
	rf := entry("", topics.RoleDLQ)
	rf.Name = testkit.Topic(t, "rf", 3, configsOf(rf))
	rf.ReplicationFactor = 2

	missing := entry(uniqueName(t, "missing"), topics.RoleEvents)

	// A family of event topics: one member is compacted.
	fam := entry("", topics.RoleEvents)
	member := testkit.Topic(t, "fam", 3, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")})
	fam.Name, fam.Pattern = "", "^"+strings.ReplaceAll(member, ".", `\.`)+"$"

	spec := parseSpec(t, good, evt, ckp, rf, missing, fam)
	visible(ctx, t, good.Name, evt.Name, ckp.Name, rf.Name, member)
	drifts, err := topics.Verify(ctx, admin(t), spec)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	assertDrifts(t, "Verify", drifts,
		`topic "`+evt.Name+`": partitions is "2", want "3"`,
		`topic "`+evt.Name+`": cleanup.policy is "compact", want "delete"`,
		`topic "`+evt.Name+`": compression.type is "gzip", want "zstd"`,
		`topic "`+evt.Name+`": retention.ms is "1000", want "604800000"`,
		`topic "`+evt.Name+`": max.message.bytes is "1048588", want "2097152"`,
		`topic "`+ckp.Name+`": cleanup.policy is "delete", want "compact"`,
		`topic "`+rf.Name+`": replication_factor is "1", want "2"`,
		`topic "`+missing.Name+`": missing`,
		`topic "`+member+`": cleanup.policy is "compact", want "delete"`,
		`topic "`+member+`": compression.type is "producer", want "zstd"`,
		`topic "`+member+`": max.message.bytes is "1048588", want "2097152"`,
	)
	for _, d := range drifts {
		if d.Topic == good.Name {
			t.Errorf("a topic that matches its spec drifted: %s", d)
		}
	}

	// The start-up check refuses on the same drift, and passes on the good topic alone.
	err = topics.Check(ctx, admin(t), spec)
	var de *topics.DriftError
	if !errors.Is(err, topics.ErrDrift) || !errors.As(err, &de) || len(de.Drifts) != len(drifts) {
		t.Fatalf("Check = %v, want a *DriftError with %d drifts", err, len(drifts))
	}
	if err := topics.Check(ctx, admin(t), parseSpec(t, good)); err != nil {
		t.Fatalf("Check of a matching topic: %v", err)
	}

	// The relay's per-topic check: only the topics asked about, each against
	// the entry that governs it (named or pattern); an ungoverned one is named.
	stray := "stray-" + member
	drifts, err = topics.VerifyTopics(ctx, admin(t), spec, good.Name, member, stray, good.Name)
	if err != nil {
		t.Fatalf("VerifyTopics: %v", err)
	}
	assertDrifts(t, "VerifyTopics", drifts,
		`topic "`+member+`": cleanup.policy is "compact", want "delete"`,
		`topic "`+member+`": compression.type is "producer", want "zstd"`,
		`topic "`+member+`": max.message.bytes is "1048588", want "2097152"`,
		`topic "`+stray+`": not in the topic spec`,
	)
	if err := topics.CheckTopics(ctx, admin(t), spec, good.Name); err != nil {
		t.Fatalf("CheckTopics of a matching topic: %v", err)
	}
	if err := topics.CheckTopics(ctx, admin(t), spec, evt.Name); !errors.Is(err, topics.ErrDrift) || !strings.Contains(err.Error(), `cleanup.policy is "compact", want "delete"`) {
		t.Fatalf("CheckTopics of the compacted event topic = %v, want drift naming cleanup.policy", err)
	}
}

// TestContractApply checks what apply changes and what it leaves to an
// operator: it creates a missing topic with every spec setting, sets the
// configs of a compacted event topic back to the spec, reports (and does not
// change) a topic with too few partitions, and a second run is a no-op.
func TestContractApply(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	adm := admin(t)

	missing := entry(uniqueName(t, "created"), topics.RoleEvents)
	ckpMissing := entry(uniqueName(t, "ckp"), topics.RoleCheckpoint)
	compacted := entry("", topics.RoleEvents)
	compacted.Name = testkit.Topic(t, "compacted", 3, map[string]*string{
		"cleanup.policy": kadm.StringPtr("compact"), "unclean.leader.election.enable": kadm.StringPtr("true"),
	})
	compacted.Configs["unclean.leader.election.enable"] = "false"
	few := entry("", topics.RoleEvents)
	few.Name = testkit.Topic(t, "few", 1, configsOf(few))

	spec := parseSpec(t, missing, ckpMissing, compacted, few)
	visible(ctx, t, compacted.Name, few.Name)
	res, err := topics.Apply(ctx, adm, spec)
	if !errors.Is(err, topics.ErrDrift) {
		t.Fatalf("Apply = %v, want drift left for the partitions it must not change", err)
	}
	slices.Sort(res.Created)
	wantCreated := []string{missing.Name, ckpMissing.Name}
	slices.Sort(wantCreated)
	if !slices.Equal(res.Created, wantCreated) {
		t.Errorf("Apply created %q, want %q", res.Created, wantCreated)
	}
	assertDrifts(t, "Apply altered", res.Altered,
		`topic "`+compacted.Name+`": cleanup.policy is "compact", want "delete"`,
		`topic "`+compacted.Name+`": compression.type is "producer", want "zstd"`,
		`topic "`+compacted.Name+`": max.message.bytes is "1048588", want "2097152"`,
		`topic "`+compacted.Name+`": unclean.leader.election.enable is "true", want "false"`,
	)
	assertDrifts(t, "Apply remaining", res.Remaining, `topic "`+few.Name+`": partitions is "1", want "3"`)

	// What Apply did is what Verify sees, from a fresh client.
	drifts, err := topics.Verify(ctx, admin(t), spec)
	if err != nil {
		t.Fatalf("Verify after Apply: %v", err)
	}
	assertDrifts(t, "Verify after Apply", drifts, `topic "`+few.Name+`": partitions is "1", want "3"`)
	td, err := adm.ListTopics(ctx, few.Name)
	if err != nil || len(td[few.Name].Partitions) != 1 {
		t.Fatalf("Apply changed the partition count of %s: %v %v", few.Name, td[few.Name].Partitions, err)
	}

	// Idempotent: nothing to do the second time.
	res, err = topics.Apply(ctx, adm, parseSpec(t, missing, ckpMissing, compacted))
	if err != nil || len(res.Created)+len(res.Altered)+len(res.Remaining) != 0 {
		t.Fatalf("second Apply = %+v, %v; want nothing done and no error", res, err)
	}
}

// TestContractTopicsCommand drives `topics verify` and `topics apply` as the
// relay binary would: a spec file with production replication, overridden to
// one replica for the single local broker; verify fails naming the missing
// topics, apply creates them, verify then passes.
func TestContractTopicsCommand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	evt := entry(uniqueName(t, "cmd-evt"), topics.RoleEvents)
	ckp := entry(uniqueName(t, "cmd-ckp"), topics.RoleCheckpoint)
	evt.ReplicationFactor, evt.MinInsyncReplicas = 3, 2
	ckp.ReplicationFactor, ckp.MinInsyncReplicas = 3, 2
	b, err := json.Marshal(topics.Spec{Format: topics.SpecFormat, Topics: []topics.TopicSpec{evt, ckp}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "topics.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		all := append(args, "-kafka-brokers", testkit.KafkaBrokers(t), "-topics-spec", path, "-topics-replication-factor", "1")
		err := topics.Command(ctx, "relay", all, &out, nil)
		return out.String(), err
	}

	out, err := run("verify")
	if !errors.Is(err, topics.ErrDrift) {
		t.Fatalf("verify before apply = %v, want drift\n%s", err, out)
	}
	for _, n := range []string{evt.Name, ckp.Name} {
		if !strings.Contains(out, `drift: topic "`+n+`": missing`) {
			t.Errorf("verify output does not name missing topic %s:\n%s", n, out)
		}
	}
	if out, err = run("apply"); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	if strings.Count(out, "created: topic") != 2 {
		t.Errorf("apply output should name two created topics:\n%s", out)
	}
	if out, err = run("verify"); err != nil || !strings.Contains(out, "topics match the contract") {
		t.Fatalf("verify after apply = %v\n%s", err, out)
	}
	// Only the checkpoint role, and a bad role named in the error.
	if out, err = run("verify", "-topics-roles", "checkpoint"); err != nil || !strings.Contains(out, "(1 spec entries)") {
		t.Fatalf("verify -topics-roles checkpoint = %v\n%s", err, out)
	}
	if _, err = run("verify", "-topics-roles", "audit"); err == nil || !strings.Contains(err.Error(), `"audit"`) {
		t.Fatalf("verify -topics-roles audit = %v, want an error naming the role", err)
	}
	if err = topics.Command(ctx, "relay", []string{"frobnicate"}, &bytes.Buffer{}, nil); err == nil {
		t.Fatalf("unknown subcommand accepted")
	}
}

// TestContractDefaultSpecApplies applies the shipped contract/topics.json
// (under unique names, one replica) to the real broker: Kafka accepts every
// production setting it names, and the result verifies clean.
func TestContractDefaultSpecApplies(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	def, err := topics.Default()
	if err != nil {
		t.Fatal(err)
	}
	var entries []topics.TopicSpec
	for _, e := range def.WithReplicationFactor(1).Topics {
		if e.Name == "" {
			continue // patterns are verified, never created
		}
		e.Name = uniqueName(t, e.Name)
		entries = append(entries, e)
	}
	spec := parseSpec(t, entries...)
	res, err := topics.Apply(ctx, admin(t), spec)
	if err != nil {
		t.Fatalf("Apply of the default spec: %v", err)
	}
	if len(res.Created) != len(entries) || len(res.Altered) != 0 {
		t.Fatalf("Apply of the default spec = %+v, want %d topics created and nothing altered", res, len(entries))
	}
	if err := topics.Check(ctx, admin(t), spec); err != nil {
		t.Fatalf("default spec topics drift right after Apply: %v", err)
	}
}
