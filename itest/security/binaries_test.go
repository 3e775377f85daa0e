package security

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/kafkaconn"
	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

// binEnv is what both binaries get in every run of this file.
type binEnv struct {
	db                   *testkit.DB
	rs                   roleSet
	topic, checkpoints   string
	dlq, group, handlers string
}

func setupBinaries(t *testing.T) binEnv {
	t.Helper()
	ctx := context.Background()
	rs := newRoles(t)
	db := testkit.NewDB(t)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE public.sec_effects (event_id text PRIMARY KEY, source text NOT NULL, seq bigint NOT NULL, n integer NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	applyRoles(t, db.URL, rs, false)
	if _, err := db.Pool.Exec(ctx, "GRANT SELECT, INSERT, UPDATE ON public.sec_effects TO "+pgx.Identifier{rs.consumer}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	createLogins(t, db, rs)
	e := binEnv{
		db: db, rs: rs,
		topic:       secureTopic(t, uniqueName(t, "events"), 3, nil),
		checkpoints: secureTopic(t, prefix+"checkpoints-"+randHex(4), 1, map[string]*string{"cleanup.policy": testkit.StringPtr("compact")}),
		dlq:         secureTopic(t, prefix+"dlq-"+randHex(4), 1, nil),
		group:       prefix + "g-" + randHex(4),
		handlers: writeFile(t, "handlers.json", []byte(fmt.Sprintf(`{"handlers": [{"event_type": "*", "kind": "sql", "sql": %q}]}`,
			`INSERT INTO public.sec_effects (event_id, source, seq, n) VALUES (:event_id, :source, :seq, 1)
ON CONFLICT (event_id) DO UPDATE SET n = public.sec_effects.n + 1`))),
	}
	return e
}

// relayArgs configures the relay through flags only, as its login role.
func (e binEnv) relayArgs(t *testing.T, password, caFile string) []string {
	return []string{"run",
		"-database-url=" + withUser(t, e.db.URL, login(e.rs.relay)),
		"-kafka-brokers=" + broker.Brokers,
		"-kafka-tls", "-kafka-tls-ca-file=" + caFile,
		"-kafka-sasl-mechanism=" + kafkaconn.MechanismSCRAMSHA512,
		"-kafka-sasl-user=" + relayUser,
		"-kafka-sasl-password-file=" + writeFile(t, "relay-password", []byte(password+"\n")),
		"-checkpoint-topic=" + e.checkpoints,
		"-transactional-id-prefix=" + prefix + "txn-" + randHex(3) + "-",
		"-http-addr=", "-log-level=debug",
	}
}

// consumerEnv configures the consumer through the environment (the
// password in ONCEFLOW_KAFKA_SASL_PASSWORD), as its login role.
func (e binEnv) consumerEnv(t *testing.T, password string) []string {
	return []string{
		"ONCEFLOW_DATABASE_URL=" + withUser(t, e.db.URL, login(e.rs.consumer)),
		"ONCEFLOW_KAFKA_BROKERS=" + broker.Brokers,
		"ONCEFLOW_KAFKA_TLS=true",
		"ONCEFLOW_KAFKA_TLS_CA_FILE=" + broker.CAFile,
		"ONCEFLOW_KAFKA_SASL_MECHANISM=" + kafkaconn.MechanismSCRAMSHA256,
		"ONCEFLOW_KAFKA_SASL_USER=" + consumerUser,
		"ONCEFLOW_KAFKA_SASL_PASSWORD=" + password,
		"ONCEFLOW_GROUP=" + e.group,
		"ONCEFLOW_TOPICS=" + e.topic,
		"ONCEFLOW_DLQ_TOPIC=" + e.dlq,
		"ONCEFLOW_HANDLERS_FILE=" + e.handlers,
		"ONCEFLOW_HTTP_ADDR=",
		"ONCEFLOW_LOG_LEVEL=debug",
	}
}

// enqueue commits n events as the writer role.
func (e binEnv) enqueue(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{e.rs.writer}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := outbox.Enqueue(ctx, tx, outbox.Message{Topic: e.topic, Source: fmt.Sprintf("order-%d", i%4),
			EventType: "order.created", Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))}); err != nil {
			t.Fatalf("enqueue as writer: %v", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() (bool, string)) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s (%s)", what, state)
		case <-tick.C:
		}
	}
}

func assertNoSecrets(t *testing.T, p *testkit.Proc, secrets ...string) {
	t.Helper()
	out := p.Output()
	if out == "" {
		t.Fatalf("%s printed nothing: the check would prove nothing", p.Name)
	}
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Fatalf("%s's output contains a password:\n%s", p.Name, out)
		}
	}
}

// TestBinariesSecure runs the real relay and consumer binaries against the
// SASL_SSL broker (relay: flags and a password file, SCRAM-SHA-512;
// consumer: environment with ONCEFLOW_KAFKA_SASL_PASSWORD, SCRAM-SHA-256),
// each as a login member of its least-privilege database role and as a Kafka
// user holding only the documented ACLs. Every event enqueued by the writer
// role is applied once; the debug-level logs of both never contain a
// password.
func TestBinariesSecure(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := setupBinaries(t)
	const n = 40
	e.enqueue(t, n)

	relayBin, consumerBin := testkit.Binary(t, "relay"), testkit.Binary(t, "consumer")
	relay := testkit.Start(t, "relay", relayBin, nil, e.relayArgs(t, relayPass, broker.CAFile)...)
	consumer := testkit.Start(t, "consumer", consumerBin, e.consumerEnv(t, consumerPass), "run")

	count := func(sql string) int {
		var c int
		if err := e.db.Pool.QueryRow(ctx, sql).Scan(&c); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return c
	}
	waitUntil(t, ctx, "every event applied once", func() (bool, string) {
		if relay.Exited() || consumer.Exited() {
			t.Fatalf("a binary exited early\nrelay:\n%s\nconsumer:\n%s", relay.Output(), consumer.Output())
		}
		applied := count(`SELECT count(*) FROM public.sec_effects`)
		return applied >= n, fmt.Sprintf("%d of %d applied", applied, n)
	})
	if dup := count(`SELECT count(*) FROM public.sec_effects WHERE n <> 1`); dup != 0 {
		t.Fatalf("%d events applied more than once", dup)
	}
	waitUntil(t, ctx, "every outbox row marked", func() (bool, string) {
		left := count(`SELECT count(*) FROM onceflow.outbox_pending`)
		return left == 0, fmt.Sprintf("%d unpublished", left)
	})
	for _, p := range []*testkit.Proc{relay, consumer} {
		p.Signal(syscall.SIGTERM)
		if err := p.Wait(30 * time.Second); err != nil {
			t.Fatalf("%s after SIGTERM: %v\n%s", p.Name, err, p.Output())
		}
		assertNoSecrets(t, p, relayPass, consumerPass)
	}
}

// TestBinariesRefuseBadCredentials: each binary, with a wrong password or
// with a CA that did not sign the broker's certificate, says why in its logs
// (authentication failed; certificate signed by unknown authority), and no
// password appears.
func TestBinariesRefuseBadCredentials(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := setupBinaries(t)
	const wrong = "wrong-Pa55-pw-0d9f"
	other, err := testkit.NewTestCA("some other CA")
	if err != nil {
		t.Fatal(err)
	}
	otherCA := writeFile(t, "other-ca.pem", other.CertPEM)
	relayBin, consumerBin := testkit.Binary(t, "relay"), testkit.Binary(t, "consumer")
	authFailed := regexp.MustCompile(`(?i)authentication failed`)
	unknownCA := regexp.MustCompile(`certificate signed by unknown authority`)
	runs := []struct {
		p    *testkit.Proc
		want *regexp.Regexp
	}{
		{testkit.Start(t, "relay-wrong-password", relayBin, nil, e.relayArgs(t, wrong, broker.CAFile)...), authFailed},
		{testkit.Start(t, "relay-untrusted-ca", relayBin, nil, e.relayArgs(t, relayPass, otherCA)...), unknownCA},
		{testkit.Start(t, "consumer-wrong-password", consumerBin, e.consumerEnv(t, wrong), "run"), authFailed},
		{testkit.Start(t, "consumer-untrusted-ca", consumerBin,
			append(e.consumerEnv(t, consumerPass), "ONCEFLOW_KAFKA_TLS_CA_FILE="+otherCA), "run"), unknownCA},
	}
	for _, r := range runs {
		line, err := r.p.WaitFor(ctx, r.want)
		if err != nil {
			t.Fatalf("%s: %v\n%s", r.p.Name, err, r.p.Output())
		}
		t.Logf("%s: %s", r.p.Name, line)
		r.p.Kill()
		assertNoSecrets(t, r.p, wrong, relayPass, consumerPass)
	}
}
