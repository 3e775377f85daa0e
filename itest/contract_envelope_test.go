package itest

import (
	"bufio"
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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/contract"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/envelope"
)

// envelopeSchema compiles contract/envelope.schema.json with content
// assertions on, so a JSON content type with a non-JSON value fails.
func envelopeSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	b, err := contract.FS.ReadFile("envelope.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("envelope.schema.json is not JSON: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertContent()
	if err := c.AddResource("envelope.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("envelope.schema.json")
	if err != nil {
		t.Fatalf("compile envelope.schema.json: %v", err)
	}
	return s
}

// kcatRecord is one line of `kcat -C -J`.
type kcatRecord struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	TS        int64     `json:"ts"`
	Headers   []*string `json:"headers"`
	Key       *string   `json:"key"`
	Payload   *string   `json:"payload"`
}

// normalize turns a kcat line into the document the schema describes, as
// docs/contract.md says: headers from the alternating array into an object
// (a repeated name is an error), payload -> value, ts -> timestamp_ms.
func normalize(line []byte) (map[string]any, *kcatRecord, error) {
	var r kcatRecord
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, nil, fmt.Errorf("kcat line is not JSON: %v", err)
	}
	if len(r.Headers)%2 != 0 {
		return nil, nil, fmt.Errorf("kcat headers array has odd length %d", len(r.Headers))
	}
	hs := map[string]any{}
	for i := 0; i < len(r.Headers); i += 2 {
		if r.Headers[i] == nil {
			return nil, nil, fmt.Errorf("a header name is null")
		}
		name := *r.Headers[i]
		if _, dup := hs[name]; dup {
			return nil, nil, fmt.Errorf("header %q appears twice", name)
		}
		if v := r.Headers[i+1]; v != nil {
			hs[name] = *v
		} else {
			hs[name] = nil
		}
	}
	doc := map[string]any{
		"topic": r.Topic, "partition": r.Partition, "offset": r.Offset, "timestamp_ms": r.TS,
		"headers": hs, "key": nil, "value": nil,
	}
	if r.Key != nil {
		doc["key"] = *r.Key
	}
	if r.Payload != nil {
		doc["value"] = *r.Payload
	}
	// Round-trip through the schema library's decoder so numbers are what
	// it expects.
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, nil, err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, nil, err
	}
	return v.(map[string]any), &r, nil
}

// readWithKcat reads topic from the start with read_committed until the end
// of every partition, after waiting until no transaction is still open on it
// (EndTransaction returns before the markers are written, and kcat -e stops
// at the last stable offset).
func readWithKcat(ctx context.Context, t *testing.T, topic string) [][]byte {
	t.Helper()
	adm := kadm.NewClient(testkit.Client(t))
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		hw, err1 := adm.ListEndOffsets(ctx, topic)
		ls, err2 := adm.ListCommittedOffsets(ctx, topic)
		if err := errors.Join(err1, err2, hw.Error(), ls.Error()); err != nil {
			t.Fatalf("list offsets of %s: %v", topic, err)
		}
		stable := true
		hw.Each(func(o kadm.ListedOffset) {
			if l, ok := ls.Lookup(topic, o.Partition); !ok || l.Offset != o.Offset {
				stable = false
			}
		})
		if stable {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("transactions on %s never completed: %v", topic, ctx.Err())
		case <-time.After(wait):
		}
	}
	kcat := os.Getenv("ONCEFLOW_KCAT")
	if kcat == "" {
		kcat = "kcat"
	}
	cmd := exec.CommandContext(ctx, kcat, "-b", testkit.KafkaBrokers(t), "-C", "-J", "-e", "-q",
		"-X", "isolation.level=read_committed", "-t", topic)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kcat (Debian package kcat) reading %s: %v\n%s", topic, err, stderr.String())
	}
	var lines [][]byte
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		if l := bytes.TrimSpace(sc.Bytes()); len(l) > 0 {
			lines = append(lines, slices.Clone(l))
		}
	}
	return lines
}

// event is one published event as the test remembers it.
type event struct {
	env     envelope.Envelope
	aborted bool // only ever in an aborted transaction
	copies  int  // committed copies on the topic
}

// TestContractEnvelopeKcatReferenceConsumer publishes events the way the
// relay does (envelope records inside Kafka transactions), including an
// aborted transaction later retried, an event that exists only in an aborted
// transaction, a second committed copy of one event and a source whose key
// changed so that it spans two partitions. It reads the topic with kcat in
// read_committed mode and checks that every record is valid against
// contract/envelope.schema.json and carries exactly the envelope sent, that
// aborted records are invisible, and that contract/reference_consumer.py,
// written only from docs/contract.md, applies each event once and each
// source in seq order, whatever the interleaving of partitions.
func TestContractEnvelopeKcatReferenceConsumer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	const partitions = 3
	topic := testkit.Topic(t, "contract", partitions, nil)
	schema := envelopeSchema(t)

	ev := func(id, source string, seq int64) *event {
		return &event{env: envelope.Envelope{
			EventID: id, Source: source, Seq: seq, EventType: "order.created",
			Payload: fmt.Appendf(nil, `{"id":%q,"seq":%d,"note":"grüße"}`, id, seq),
		}}
	}
	o1 := []*event{ev("o1-1", "order-1", 1), ev("o1-2", "order-1", 2), ev("o1-3", "order-1", 3), ev("o1-4", "order-1", 4)}
	o2 := []*event{ev("o2-1", "order-2", 1), ev("o2-2", "order-2", 2), ev("o2-3", "order-2", 3)}
	th := []*event{ev("th-1", "thread-9", 1), ev("th-2", "thread-9", 2), ev("th-3", "thread-9", 3), ev("th-4", "thread-9", 4)}
	ghost := ev("ghost-1", "ghost", 1)
	ghost.aborted = true
	// Variety the schema must accept: a trace, application headers, a
	// +json type and a non-JSON payload.
	o1[0].env.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	o1[1].env.Headers = map[string]string{"tenant": "acme", "x-empty": ""}
	o2[0].env.ContentType = "application/vnd.onceflow.order+json; charset=utf-8"
	o2[1].env.ContentType, o2[1].env.EventType = "text/plain; charset=utf-8", "order.note"
	o2[1].env.Payload = []byte("plain text, not JSON")
	// order-1 and thread-9 come from a relay that names its producer;
	// order-2 from one before the producer header (a legacy stream).
	for _, e := range slices.Concat(o1, th) {
		e.env.Producer = "4f0c2b7e-contract-db"
	}
	// thread-9's key changes after seq 2 to one on another partition.
	part := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	home := part.Partition(&kgo.Record{Key: []byte("thread-9")}, partitions)
	for i := 0; ; i++ {
		k := []byte("thread-9/rekeyed-" + strconv.Itoa(i))
		if part.Partition(&kgo.Record{Key: k}, partitions) != home {
			th[2].env.Key, th[3].env.Key = k, k
			break
		}
	}
	all := slices.Concat(o1, o2, th, []*event{ghost})

	prod := testkit.Client(t, kgo.TransactionalID("contract-"+topic))
	txn := func(commit bool, evs ...*event) {
		t.Helper()
		if err := prod.BeginTransaction(); err != nil {
			t.Fatalf("begin: %v", err)
		}
		for _, e := range evs {
			if err := e.env.Validate(0); err != nil {
				t.Fatalf("test event %s is invalid: %v", e.env.EventID, err)
			}
			if err := prod.ProduceSync(ctx, e.env.Record(topic)).FirstErr(); err != nil {
				t.Fatalf("produce %s: %v", e.env.EventID, err)
			}
			if commit {
				e.copies++
			}
		}
		if err := prod.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatalf("end transaction (commit=%v): %v", commit, err)
		}
	}
	txn(true, o1[0], o1[1], o2[0], th[0], th[1])
	txn(false, o1[2], o1[3], ghost, o2[1]) // aborted: a relay crash mid-batch
	txn(true, o1[2], o1[3], o2[1], o2[2])  // the batch retried
	txn(true, th[2], th[3])                // thread-9 under its new key
	txn(true, o2[1])                       // a duplicate copy of o2-2

	lines := readWithKcat(ctx, t, topic)
	byID := map[string]*event{}
	for _, e := range all {
		byID[e.env.EventID] = e
	}
	seen := map[string]int{}
	thParts := map[int32]bool{}
	for _, line := range lines {
		doc, rec, err := normalize(line)
		if err != nil {
			t.Fatalf("record breaks the contract: %v\n%s", err, line)
		}
		if err := schema.Validate(doc); err != nil {
			t.Fatalf("record %s/%d@%d is invalid against contract/envelope.schema.json:\n%v\n%s", rec.Topic, rec.Partition, rec.Offset, err, line)
		}
		hs := doc["headers"].(map[string]any)
		id, _ := hs[envelope.HeaderEventID].(string)
		e := byID[id]
		if e == nil {
			t.Fatalf("kcat read an event the test did not publish: %s", line)
		}
		seen[id]++
		checkSame(t, e, doc)
		if e.env.Source == "thread-9" {
			thParts[rec.Partition] = true
		}
	}
	for _, e := range all {
		if seen[e.env.EventID] != e.copies {
			t.Errorf("event %s: kcat (read_committed) saw %d copies, %d were committed", e.env.EventID, seen[e.env.EventID], e.copies)
		}
	}
	if len(thParts) != 2 {
		t.Fatalf("thread-9 should span two partitions after its key changed, saw %v", thParts)
	}

	// The reference consumer on kcat's interleaving, and on the partitions
	// fed one after another in both orders: the result may not depend on
	// how partitions interleave.
	byPart := map[int32][][]byte{}
	for _, l := range lines {
		var r kcatRecord
		_ = json.Unmarshal(l, &r)
		byPart[r.Partition] = append(byPart[r.Partition], l)
	}
	var forward, backward [][]byte
	for p := int32(0); p < partitions; p++ {
		forward = append(forward, byPart[p]...)
		backward = append(backward, byPart[partitions-1-p]...)
	}
	parkedSomewhere := false
	for name, input := range map[string][][]byte{"kcat order": lines, "partitions ascending": forward, "partitions descending": backward} {
		applied, summary := runReferenceConsumer(ctx, t, input)
		want := []string{"o1-1", "o1-2", "o1-3", "o1-4", "o2-1", "o2-2", "o2-3", "th-1", "th-2", "th-3", "th-4"}
		var got []string
		next := map[string]int64{}
		for _, a := range applied {
			got = append(got, a.EventID)
			if a.Seq != next[a.Source]+1 {
				t.Errorf("%s: reference consumer applied %s seq %d after seq %d", name, a.Source, a.Seq, next[a.Source])
			}
			next[a.Source] = a.Seq
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: reference consumer applied %q, want each of %q once (and never ghost-1)", name, got, want)
		}
		if summary.Duplicates != 1 || len(summary.Gaps) != 0 {
			t.Errorf("%s: reference consumer summary %+v, want 1 duplicate and no gaps", name, summary)
		}
		// Did thread-9's later partition come first in this input?
		first := -1
		for i, l := range input {
			if bytes.Contains(l, []byte(`"th-3"`)) || bytes.Contains(l, []byte(`"th-1"`)) {
				first = i
				parkedSomewhere = parkedSomewhere || bytes.Contains(l, []byte(`"th-3"`))
				break
			}
		}
		if first < 0 {
			t.Fatalf("%s: no thread-9 record in the input", name)
		}
	}
	if !parkedSomewhere {
		t.Fatalf("no input made the reference consumer park thread-9's later events")
	}
}

// checkSame compares what kcat saw with the envelope that was sent.
func checkSame(t *testing.T, e *event, doc map[string]any) {
	t.Helper()
	hs := doc["headers"].(map[string]any)
	ct := e.env.ContentType
	if ct == "" {
		ct = envelope.ContentTypeJSON
	}
	want := map[string]string{
		envelope.HeaderEventID: e.env.EventID, envelope.HeaderSource: e.env.Source,
		envelope.HeaderSeq: strconv.FormatInt(e.env.Seq, 10), envelope.HeaderEventType: e.env.EventType,
		envelope.HeaderContentType: ct,
	}
	if e.env.Traceparent != "" {
		want[envelope.HeaderTraceparent] = e.env.Traceparent
	}
	if e.env.Producer != "" {
		want[envelope.HeaderProducer] = e.env.Producer
	}
	for k, v := range e.env.Headers {
		want[k] = v
	}
	if len(hs) != len(want) {
		t.Errorf("%s: headers %v, want %v", e.env.EventID, hs, want)
	}
	for k, v := range want {
		if hs[k] != v {
			t.Errorf("%s: header %s = %v, want %q", e.env.EventID, k, hs[k], v)
		}
	}
	if got, want := doc["key"], string(e.env.RecordKey()); got != want {
		t.Errorf("%s: key %v, want %q", e.env.EventID, got, want)
	}
	if e.env.Key == nil && doc["key"] != e.env.Source {
		t.Errorf("%s: key %v is not the source %q", e.env.EventID, doc["key"], e.env.Source)
	}
	if got := doc["value"]; got != string(e.env.Payload) {
		t.Errorf("%s: value %v, want %q", e.env.EventID, got, e.env.Payload)
	}
}

type appliedEvent struct {
	EventID   string `json:"event_id"`
	Source    string `json:"source"`
	Seq       int64  `json:"seq"`
	EventType string `json:"event_type"`
}

type consumerSummary struct {
	Applied    int            `json:"applied"`
	Duplicates int            `json:"duplicates"`
	Gaps       map[string]any `json:"gaps"`
}

// runReferenceConsumer feeds kcat lines to contract/reference_consumer.py.
func runReferenceConsumer(ctx context.Context, t *testing.T, lines [][]byte) ([]appliedEvent, consumerSummary) {
	t.Helper()
	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "python3", filepath.Join(root, "contract", "reference_consumer.py"))
	cmd.Stdin = bytes.NewReader(append(bytes.Join(lines, []byte("\n")), '\n'))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("contract/reference_consumer.py: %v\nstderr: %s", err, stderr.String())
	}
	var applied []appliedEvent
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var a appliedEvent
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatalf("reference consumer printed %q: %v", l, err)
		}
		applied = append(applied, a)
	}
	var s consumerSummary
	if err := json.Unmarshal(bytes.TrimSpace(stderr.Bytes()), &s); err != nil {
		t.Fatalf("reference consumer summary %q: %v", stderr.String(), err)
	}
	return applied, s
}

// TestContractEnvelopeSchemaRejects checks that the schema is not vacuous:
// one valid record, then one change at a time that breaks the contract.
func TestContractEnvelopeSchemaRejects(t *testing.T) {
	t.Parallel()
	schema := envelopeSchema(t)
	valid := `{"topic":"t","partition":0,"offset":7,"tstype":"create","ts":1796013562703,"broker":1,` +
		`"headers":["event-id","e-1","source","order-1","seq","12","event-type","order.created","content-type","application/json","traceparent","00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","producer","db-7","tenant","acme"],` +
		`"key":"order-1","payload":"{\"total\":42}"}`
	doc, _, err := normalize([]byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	if err := schema.Validate(doc); err != nil {
		t.Fatalf("valid record rejected: %v", err)
	}
	cases := []struct{ name, from, to, want string }{
		{"no event-id", `"event-id","e-1",`, ``, "event-id"},
		{"empty source", `"source","order-1"`, `"source",""`, "source"},
		{"seq zero", `"seq","12"`, `"seq","0"`, "seq"},
		{"seq leading zero", `"seq","12"`, `"seq","012"`, "seq"},
		{"seq negative", `"seq","12"`, `"seq","-1"`, "seq"},
		{"seq not a number", `"seq","12"`, `"seq","twelve"`, "seq"},
		{"no event-type", `"event-type","order.created",`, ``, "event-type"},
		{"no content-type", `"content-type","application/json",`, ``, "content-type"},
		{"bad content-type", `"content-type","application/json"`, `"content-type","json"`, "content-type"},
		{"json type, value not json", `"payload":"{\"total\":42}"`, `"payload":"{total"`, "value"},
		{"json+suffix type, value not json", `"content-type","application/json"`, `"content-type","application/vnd.x+json; charset=utf-8"`, ""},
		{"control char in id", `"event-id","e-1"`, `"event-id","e\n1"`, "event-id"},
		{"reserved id prefix", `"event-id","e-1"`, `"event-id","malformed:t:0:7"`, "event-id"},
		{"seq with a plus sign", `"seq","12"`, `"seq","+12"`, "seq"},
		{"bad traceparent", `"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"`, `"trace-me"`, "traceparent"},
		{"empty producer", `"producer","db-7"`, `"producer",""`, "producer"},
		{"control char in producer", `"producer","db-7"`, `"producer","db\n7"`, "producer"},
		{"null application header", `"tenant","acme"`, `"tenant",null`, "tenant"},
		{"null key", `"key":"order-1"`, `"key":null`, "key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			line := strings.Replace(valid, tc.from, tc.to, 1)
			if line == valid {
				t.Fatalf("test case does not change the record")
			}
			if tc.name == "json+suffix type, value not json" {
				line = strings.Replace(line, `"payload":"{\"total\":42}"`, `"payload":"nope"`, 1)
				tc.want = "value"
			}
			doc, _, err := normalize([]byte(line))
			if err != nil {
				t.Fatal(err)
			}
			err = schema.Validate(doc)
			if err == nil {
				t.Fatalf("schema accepted a record with %s", tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error does not name %q: %v", tc.want, err)
			}
		})
	}
	// A repeated header cannot be expressed in the schema's object; the
	// normalisation refuses it.
	dup := strings.Replace(valid, `"tenant","acme"`, `"seq","13"`, 1)
	if _, _, err := normalize([]byte(dup)); err == nil || !strings.Contains(err.Error(), `"seq" appears twice`) {
		t.Fatalf("repeated seq header: %v", err)
	}
	// Non-JSON content types carry any value.
	plain := strings.Replace(strings.Replace(valid, `"application/json"`, `"text/plain"`, 1), `"payload":"{\"total\":42}"`, `"payload":"hi"`, 1)
	if doc, _, _ := normalize([]byte(plain)); schema.Validate(doc) != nil {
		t.Fatalf("text/plain record with a text value rejected: %v", schema.Validate(doc))
	}
}

// TestContractVersion keeps the contract's version in one place:
// contract/VERSION, the schema's $id (major) and x-onceflow-contract-version,
// and docs/contract.md agree.
func TestContractVersion(t *testing.T) {
	t.Parallel()
	v := contract.Version()
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(v) {
		t.Fatalf("contract/VERSION %q is not a semantic version", v)
	}
	b, _ := contract.FS.ReadFile("envelope.schema.json")
	var s struct {
		ID      string `json:"$id"`
		Version string `json:"x-onceflow-contract-version"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	major, _, _ := strings.Cut(v, ".")
	if s.Version != v || !strings.Contains(s.ID, "/"+major+"/") {
		t.Errorf("schema $id %q / x-onceflow-contract-version %q disagree with contract/VERSION %q", s.ID, s.Version, v)
	}
	root, err := testkit.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "contract.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "Contract version **"+v+"**") {
		t.Errorf("docs/contract.md does not state contract version %s", v)
	}
	// Every header the envelope package defines is in the schema and the doc.
	for _, h := range []string{envelope.HeaderEventID, envelope.HeaderSource, envelope.HeaderSeq,
		envelope.HeaderEventType, envelope.HeaderContentType, envelope.HeaderTraceparent, envelope.HeaderProducer} {
		if !bytes.Contains(b, []byte(`"`+h+`"`)) || !strings.Contains(string(doc), "`"+h+"`") {
			t.Errorf("header %s is missing from the schema or docs/contract.md", h)
		}
	}
}
