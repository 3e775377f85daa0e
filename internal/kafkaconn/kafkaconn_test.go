package kafkaconn_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/kafkaconn"
	"github.com/onceflow/onceflow/internal/testkit"
)

const secret = "s3cret-Pa55word-never-shown"

type bundle struct {
	dir                                    string
	caFile, certFile, keyFile, notPEM, pwd string
}

func setup(t *testing.T) bundle {
	t.Helper()
	dir := t.TempDir()
	ca, err := testkit.NewTestCA("kafkaconn test CA")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue("client", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	b := bundle{
		dir:      dir,
		caFile:   filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "client.pem"),
		keyFile:  filepath.Join(dir, "client-key.pem"),
		notPEM:   filepath.Join(dir, "not.pem"),
		pwd:      filepath.Join(dir, "password"),
	}
	for path, data := range map[string][]byte{
		b.caFile: ca.CertPEM, b.certFile: certPEM, b.keyFile: keyPEM,
		b.notPEM: []byte("not a certificate " + secret), b.pwd: []byte(secret + "\n"),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// parse registers the flags on a fresh FlagSet and parses args the way the
// binaries do.
func parse(t *testing.T, args ...string) (*kafkaconn.Config, error) {
	t.Helper()
	var c kafkaconn.Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	c.RegisterFlags(fs, "onceflow-test")
	if err := cli.Parse(fs, args); err != nil {
		return &c, err
	}
	return &c, c.Validate()
}

func TestValidate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	brokers := "-kafka-brokers=127.0.0.1:9092"
	cases := []struct {
		name    string
		args    []string
		wantErr string // "" means valid
	}{
		{"plaintext", []string{brokers}, ""},
		{"no brokers", nil, "-kafka-brokers (ONCEFLOW_KAFKA_BROKERS) is required"},
		{"broker without port", []string{"-kafka-brokers=kafka"}, "-kafka-brokers (ONCEFLOW_KAFKA_BROKERS)"},
		{"tls system roots", []string{brokers, "-kafka-tls"}, ""},
		{"tls ca", []string{brokers, "-kafka-tls", "-kafka-tls-ca-file=" + b.caFile}, ""},
		{"tls ca missing", []string{brokers, "-kafka-tls", "-kafka-tls-ca-file=" + b.dir + "/nope.pem"}, "-kafka-tls-ca-file (ONCEFLOW_KAFKA_TLS_CA_FILE)"},
		{"tls ca not pem", []string{brokers, "-kafka-tls", "-kafka-tls-ca-file=" + b.notPEM}, "-kafka-tls-ca-file (ONCEFLOW_KAFKA_TLS_CA_FILE): " + b.notPEM + " holds no PEM certificate"},
		{"ca without tls", []string{brokers, "-kafka-tls-ca-file=" + b.caFile}, "-kafka-tls-ca-file (ONCEFLOW_KAFKA_TLS_CA_FILE) is set but -kafka-tls (ONCEFLOW_KAFKA_TLS) is off"},
		{"server name without tls", []string{brokers, "-kafka-tls-server-name=kafka"}, "-kafka-tls-server-name (ONCEFLOW_KAFKA_TLS_SERVER_NAME) is set but -kafka-tls"},
		{"client cert", []string{brokers, "-kafka-tls", "-kafka-tls-cert-file=" + b.certFile, "-kafka-tls-key-file=" + b.keyFile}, ""},
		{"cert without key", []string{brokers, "-kafka-tls", "-kafka-tls-cert-file=" + b.certFile}, "-kafka-tls-key-file (ONCEFLOW_KAFKA_TLS_KEY_FILE) is required"},
		{"key without cert", []string{brokers, "-kafka-tls", "-kafka-tls-key-file=" + b.keyFile}, "-kafka-tls-cert-file (ONCEFLOW_KAFKA_TLS_CERT_FILE) is required"},
		{"key mismatched", []string{brokers, "-kafka-tls", "-kafka-tls-cert-file=" + b.certFile, "-kafka-tls-key-file=" + b.caFile}, "-kafka-tls-cert-file (ONCEFLOW_KAFKA_TLS_CERT_FILE)"},
		{"scram-sha-256", []string{brokers, "-kafka-sasl-mechanism=SCRAM-SHA-256", "-kafka-sasl-user=alice", "-kafka-sasl-password-file=" + b.pwd}, ""},
		{"scram-sha-512 lower case", []string{brokers, "-kafka-sasl-mechanism=scram-sha-512", "-kafka-sasl-user=alice", "-kafka-sasl-password-file=" + b.pwd}, ""},
		{"plain over tls", []string{brokers, "-kafka-tls", "-kafka-sasl-mechanism=PLAIN", "-kafka-sasl-user=alice", "-kafka-sasl-password-file=" + b.pwd}, ""},
		{"plain without tls", []string{brokers, "-kafka-sasl-mechanism=PLAIN", "-kafka-sasl-user=alice", "-kafka-sasl-password-file=" + b.pwd}, "-kafka-sasl-mechanism (ONCEFLOW_KAFKA_SASL_MECHANISM): PLAIN sends the password in clear text"},
		{"unknown mechanism", []string{brokers, "-kafka-sasl-mechanism=GSSAPI", "-kafka-sasl-user=alice", "-kafka-sasl-password-file=" + b.pwd}, `-kafka-sasl-mechanism (ONCEFLOW_KAFKA_SASL_MECHANISM): "GSSAPI" is not one of`},
		{"mechanism without user", []string{brokers, "-kafka-sasl-mechanism=SCRAM-SHA-256", "-kafka-sasl-password-file=" + b.pwd}, "-kafka-sasl-user (ONCEFLOW_KAFKA_SASL_USER) is required"},
		{"user without mechanism", []string{brokers, "-kafka-sasl-user=alice"}, "-kafka-sasl-mechanism (ONCEFLOW_KAFKA_SASL_MECHANISM) is required"},
		{"password file without mechanism", []string{brokers, "-kafka-sasl-password-file=" + b.pwd}, "-kafka-sasl-mechanism (ONCEFLOW_KAFKA_SASL_MECHANISM) is required"},
		{"no password", []string{brokers, "-kafka-sasl-mechanism=SCRAM-SHA-256", "-kafka-sasl-user=alice"}, "-kafka-sasl-password-file (ONCEFLOW_KAFKA_SASL_PASSWORD_FILE) or $ONCEFLOW_KAFKA_SASL_PASSWORD is required"},
		{"password file missing", []string{brokers, "-kafka-sasl-mechanism=SCRAM-SHA-256", "-kafka-sasl-user=alice", "-kafka-sasl-password-file=" + b.dir + "/nope"}, "-kafka-sasl-password-file (ONCEFLOW_KAFKA_SASL_PASSWORD_FILE)"},
		{"password flag does not exist", []string{brokers, "-kafka-sasl-password=" + secret}, "flag provided but not defined: -kafka-sasl-password"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parse(t, tc.args...)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("valid settings rejected: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("accepted, want error containing %q", tc.wantErr)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("error %q does not contain %q", err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
}

// Not parallel: it sets the process environment.
func TestPasswordFromEnvironment(t *testing.T) {
	b := setup(t)
	t.Setenv(kafkaconn.EnvSASLPassword, secret)
	t.Setenv("ONCEFLOW_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
	t.Setenv("ONCEFLOW_KAFKA_SASL_USER", "alice")
	if _, err := parse(t, "-kafka-brokers=127.0.0.1:9092"); err != nil {
		t.Fatalf("password from $%s rejected: %v", kafkaconn.EnvSASLPassword, err)
	}
	_, err := parse(t, "-kafka-brokers=127.0.0.1:9092", "-kafka-sasl-password-file="+b.pwd)
	if err == nil || !strings.Contains(err.Error(), "set more than once") {
		t.Fatalf("file and environment both set: got %v, want an error", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("error shows the password: %v", err)
	}
}

// The password never shows through fmt or slog, whichever verb or handler.
func TestRedaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := parse(t, "-kafka-brokers=127.0.0.1:9092", "-kafka-tls", "-kafka-tls-ca-file="+b.caFile,
		"-kafka-sasl-mechanism=SCRAM-SHA-256", "-kafka-sasl-user=alice", "-kafka-sasl-password-file="+b.pwd)
	if err != nil {
		t.Fatal(err)
	}
	c2 := *c
	c2.SASLPassword = secret
	c2.SASLPasswordFile = ""
	for _, cfg := range []*kafkaconn.Config{c, &c2} {
		var out bytes.Buffer
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			fmt.Fprintf(&out, verb+"\n", cfg)
			fmt.Fprintf(&out, verb+"\n", *cfg)
		}
		slog.New(slog.NewJSONHandler(&out, nil)).Info("config", "kafka", cfg, "kafka_value", *cfg)
		slog.New(slog.NewTextHandler(&out, nil)).Info("config", "kafka", cfg)
		if strings.Contains(out.String(), secret) {
			t.Fatalf("password printed:\n%s", out.String())
		}
		if !strings.Contains(out.String(), "alice") || !strings.Contains(out.String(), "SCRAM-SHA-256") {
			t.Fatalf("settings missing from the description:\n%s", out.String())
		}
	}
}

// Opts without Validate validates; bad settings make every dial fail with the
// reason instead of connecting without TLS or SASL.
func TestOptsFailsClosed(t *testing.T) {
	t.Parallel()
	c := kafkaconn.Config{Brokers: cli.List{"127.0.0.1:1"}, TLS: true, TLSCAFile: "/nonexistent/ca.pem"}
	cl, err := kgo.NewClient(c.Opts(nil)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = cl.Ping(ctx)
	if err == nil || !strings.Contains(err.Error(), "-kafka-tls-ca-file") {
		t.Fatalf("ping = %v, want the settings error", err)
	}
}

// Opts keeps its old shape for plaintext settings: seed brokers, client id,
// logger.
func TestOptsPlaintext(t *testing.T) {
	t.Parallel()
	c := kafkaconn.Config{Brokers: cli.List{"127.0.0.1:9092"}, ClientID: "x"}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := len(c.Opts(slog.New(slog.DiscardHandler))); n != 3 {
		t.Fatalf("got %d options, want 3 (seeds, client id, logger)", n)
	}
}
