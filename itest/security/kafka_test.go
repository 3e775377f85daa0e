package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/kafkaconn"
	"github.com/onceflow/onceflow/internal/logbuf"
	"github.com/onceflow/onceflow/internal/testkit"
)

func tlsConfig(caPEM []byte) *tls.Config {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// writeFile writes data into the test's directory and returns the path.
func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// secureConfig is what an operator would configure through flags: TLS with
// the broker's CA, SASL with a password file.
func secureConfig(t *testing.T, mechanism, user, password string) kafkaconn.Config {
	t.Helper()
	return kafkaconn.Config{
		Brokers:          cli.List{broker.Brokers},
		ClientID:         "onceflow-security-test",
		TLS:              true,
		TLSCAFile:        broker.CAFile,
		SASLMechanism:    mechanism,
		SASLUser:         user,
		SASLPasswordFile: writeFile(t, "kafka-password", []byte(password+"\n")),
	}
}

// newClient validates cfg, builds a client from cfg.Opts with a debug
// logger into logs, and closes it on cleanup.
func newClient(t *testing.T, cfg kafkaconn.Config, logs *logbuf.Buffer, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	log.Info("kafka settings", "kafka", cfg)
	cl, err := kgo.NewClient(append(cfg.Opts(log), extra...)...)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// secureTopic creates a topic on the private broker (as admin) and deletes
// it on cleanup.
func secureTopic(t *testing.T, name string, partitions int32, configs map[string]*string) string {
	t.Helper()
	cl, err := adminClient()
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, configs, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		cl.Close()
		t.Fatalf("create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		defer cl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, name)
	})
	return name
}

func uniqueName(t *testing.T, kind string) string {
	t.Helper()
	return prefix + kind + "-" + strings.NewReplacer("/", "-", "_", "-").Replace(strings.ToLower(t.Name())) + "-" + randHex(3)
}

// TestKafkaTransactionalRoundTrip: with the right credentials, a
// transactional producer and a read_committed group consumer built from
// kafkaconn.Config.Opts work over SASL_SSL, for every mechanism, as users
// that hold only the documented ACLs. Debug-level client logs never show the
// passwords.
func TestKafkaTransactionalRoundTrip(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{kafkaconn.MechanismSCRAMSHA256, kafkaconn.MechanismSCRAMSHA512, kafkaconn.MechanismPlain} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
			defer cancel()
			topic := secureTopic(t, uniqueName(t, "rt"), 1, nil)
			var logs logbuf.Buffer

			prod := newClient(t, secureConfig(t, mech, relayUser, relayPass), &logs,
				kgo.TransactionalID(prefix+"txn-"+topic), kgo.DefaultProduceTopic(topic))
			txn := func(value string, commit bool) {
				t.Helper()
				if err := prod.BeginTransaction(); err != nil {
					t.Fatalf("begin: %v", err)
				}
				if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte(value)}).FirstErr(); err != nil {
					t.Fatalf("produce %s: %v", value, err)
				}
				if err := prod.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
					t.Fatalf("end transaction: %v", err)
				}
			}
			txn("committed-1", true)
			txn("aborted", false)
			txn("committed-2", true)

			cons := newClient(t, secureConfig(t, mech, consumerUser, consumerPass), &logs,
				kgo.ConsumerGroup(prefix+"g-"+topic), kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
				kgo.FetchIsolationLevel(kgo.ReadCommitted()))
			var got []string
			for len(got) < 2 {
				fs := cons.PollFetches(ctx)
				if ctx.Err() != nil {
					t.Fatalf("read_committed consumer saw %q before timing out", got)
				}
				if err := fs.Err0(); err != nil {
					t.Fatalf("fetch: %v", err)
				}
				fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
			}
			if strings.Join(got, ",") != "committed-1,committed-2" {
				t.Fatalf("read_committed saw %q, want [committed-1 committed-2]", got)
			}
			if err := cons.CommitUncommittedOffsets(ctx); err != nil {
				t.Fatalf("commit offsets to the group: %v", err)
			}
			for _, pw := range []string{relayPass, consumerPass} {
				if strings.Contains(logs.String(), pw) {
					t.Fatalf("client logs show a password:\n%s", logs.String())
				}
			}
			if !strings.Contains(logs.String(), mech) {
				t.Fatalf("the logged settings do not name the mechanism:\n%s", logs.String())
			}
		})
	}
}

// TestKafkaWrongPassword: a wrong password fails with an error that says
// authentication failed and does not contain the password.
func TestKafkaWrongPassword(t *testing.T) {
	t.Parallel()
	for _, mech := range []string{kafkaconn.MechanismSCRAMSHA256, kafkaconn.MechanismSCRAMSHA512, kafkaconn.MechanismPlain} {
		t.Run(mech, func(t *testing.T) {
			t.Parallel()
			const wrong = "wrong-Pa55-e81f0c"
			var logs logbuf.Buffer
			cl := newClient(t, secureConfig(t, mech, relayUser, wrong), &logs, kgo.RequestRetries(0))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := cl.Ping(ctx)
			if err == nil {
				t.Fatal("ping with a wrong password succeeded")
			}
			if !strings.Contains(strings.ToLower(err.Error()), "authentication failed") {
				t.Fatalf("error %q does not say authentication failed", err)
			}
			t.Logf("error: %v", err)
			if strings.Contains(err.Error(), wrong) || strings.Contains(logs.String(), wrong) {
				t.Fatalf("the password shows in the error or the logs: %v\n%s", err, logs.String())
			}
		})
	}
}

// TestKafkaUntrustedCA: a broker certificate from a CA the client does not
// trust fails with a certificate error; so does a server name the
// certificate does not carry. The right name through -kafka-tls-server-name
// works.
func TestKafkaUntrustedCA(t *testing.T) {
	t.Parallel()
	other, err := testkit.NewTestCA("some other CA")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		mutate  func(*kafkaconn.Config)
		wantErr string
	}{
		{"untrusted CA", func(c *kafkaconn.Config) { c.TLSCAFile = writeFile(t, "other-ca.pem", other.CertPEM) },
			"certificate signed by unknown authority"},
		{"system roots", func(c *kafkaconn.Config) { c.TLSCAFile = "" },
			"certificate signed by unknown authority"},
		{"wrong server name", func(c *kafkaconn.Config) { c.TLSServerName = "kafka.example.com" },
			"not kafka.example.com"},
		{"right server name", func(c *kafkaconn.Config) { c.TLSServerName = "localhost" }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := secureConfig(t, kafkaconn.MechanismSCRAMSHA256, relayUser, relayPass)
			tc.mutate(&cfg)
			var logs logbuf.Buffer
			cl := newClient(t, cfg, &logs, kgo.RequestRetries(0))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := cl.Ping(ctx)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("ping: %v", err)
				}
				return
			}
			var certErr *tls.CertificateVerificationError
			if err == nil || !errors.As(err, &certErr) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ping = %v, want a certificate verification error containing %q", err, tc.wantErr)
			}
			t.Logf("error: %v", err)
		})
	}
}
