package kafkaconn_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/kafkaconn"
)

// FuzzConfig feeds arbitrary flag values and file contents through the
// binaries' parsing path (cli.Parse, Validate, Opts, String, LogValue). None
// may panic, and no error or description may contain the password.
func FuzzConfig(f *testing.F) {
	ca, err := os.ReadFile("testdata/ca.pem")
	if err != nil {
		f.Fatal(err)
	}
	f.Add("127.0.0.1:9092", "SCRAM-SHA-256", "alice", "a-long-password-1", true, "", ca, []byte{})
	f.Add("127.0.0.1:9092,[::1]:9093", "PLAIN", "bob", "another-password", false, "kafka", []byte{}, []byte{})
	f.Add("kafka", "scram-sha-512", "", "x", true, "localhost", []byte("-----BEGIN CERTIFICATE-----\n"), []byte("junk"))
	f.Add(":", "", "", "", false, "", []byte{}, []byte{})
	f.Add("a:1,,b:2", "GSSAPI", "c,d", "\n", true, "\x00", ca, ca)
	f.Fuzz(func(t *testing.T, brokers, mech, user, password string, useTLS bool, serverName string, caPEM, keyPEM []byte) {
		dir := t.TempDir()
		pwFile := filepath.Join(dir, "pw")
		caFile := filepath.Join(dir, "ca")
		keyFile := filepath.Join(dir, "key")
		for p, b := range map[string][]byte{pwFile: []byte(password), caFile: caPEM, keyFile: keyPEM} {
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		args := []string{"-kafka-brokers=" + brokers, "-kafka-sasl-password-file=" + pwFile}
		if mech != "" {
			args = append(args, "-kafka-sasl-mechanism="+mech)
		}
		if user != "" {
			args = append(args, "-kafka-sasl-user="+user)
		}
		if useTLS {
			args = append(args, "-kafka-tls", "-kafka-tls-ca-file="+caFile)
			if len(keyPEM) > 0 {
				args = append(args, "-kafka-tls-cert-file="+caFile, "-kafka-tls-key-file="+keyFile)
			}
		}
		if serverName != "" {
			args = append(args, "-kafka-tls-server-name="+serverName)
		}
		var c kafkaconn.Config
		fs := flag.NewFlagSet("fuzz", flag.ContinueOnError)
		c.RegisterFlags(fs, "onceflow")
		err := cli.Parse(fs, args)
		if err == nil {
			err = c.Validate()
		}
		_ = c.Opts(nil)
		out := c.String() + c.GoString() + c.LogValue().String()
		if err != nil {
			out += err.Error()
		}
		// Only a password that none of the other inputs contain can be
		// told apart in the output.
		pw := strings.TrimSuffix(strings.TrimSuffix(password, "\n"), "\r")
		if len(pw) < 6 {
			return
		}
		for _, other := range []string{brokers, mech, user, serverName, dir, string(caPEM), string(keyPEM), "onceflow", "kafka-"} {
			if strings.Contains(other, pw) || strings.Contains(pw, other) && other != "" && len(other) >= len(pw) {
				return
			}
		}
		if strings.Contains(out, pw) {
			t.Fatalf("password %q shown: %s", pw, out)
		}
	})
}
