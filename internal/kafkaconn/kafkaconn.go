// Package kafkaconn turns the binaries' Kafka settings into franz-go client
// options. Connection security (TLS, SASL) is added here so both binaries get
// it the same way.
//
// Secrets: the SASL password comes from a file (-kafka-sasl-password-file) or
// the environment (ONCEFLOW_KAFKA_SASL_PASSWORD), never from a flag value
// that `ps` would show. It never appears in logs or error strings: Config
// implements fmt.Stringer, fmt.GoStringer and slog.LogValuer with the
// password redacted.
package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"github.com/twmb/franz-go/plugin/kslog"

	"github.com/onceflow/onceflow/internal/cli"
)

// SASL mechanisms accepted by -kafka-sasl-mechanism.
const (
	MechanismPlain       = "PLAIN"
	MechanismSCRAMSHA256 = "SCRAM-SHA-256"
	MechanismSCRAMSHA512 = "SCRAM-SHA-512"
)

// EnvSASLPassword is the environment variable holding the SASL password when
// -kafka-sasl-password-file is not given. There is deliberately no flag for
// the password itself.
const EnvSASLPassword = "ONCEFLOW_KAFKA_SASL_PASSWORD"

const redacted = "[REDACTED]"

// Config holds the connection settings shared by both binaries.
type Config struct {
	// Brokers is the seed broker list (required).
	Brokers cli.List
	// ClientID names the client in broker logs (default "onceflow").
	ClientID string

	// SASLMechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default none:
	// no authentication). PLAIN requires TLS.
	SASLMechanism string
	// SASLPassword is the SASL password for library users that set it in
	// code (default empty: read from SASLPasswordFile or
	// ONCEFLOW_KAFKA_SASL_PASSWORD). Never registered as a flag.
	SASLPassword string
	// SASLPasswordFile is a file whose content (one trailing newline
	// trimmed) is the SASL password (default empty).
	SASLPasswordFile string
	// SASLUser is the SASL user name (required with SASLMechanism).
	SASLUser string

	// TLS turns on TLS to the brokers (default false). The system roots are
	// trusted unless TLSCAFile is given.
	TLS bool
	// TLSCAFile is a PEM bundle of the CAs trusted to sign broker
	// certificates (default empty: the system roots).
	TLSCAFile string
	// TLSCertFile is a PEM client certificate (chain) for mutual TLS
	// (default empty; needs TLSKeyFile).
	TLSCertFile string
	// TLSKeyFile is the PEM private key of TLSCertFile (default empty).
	TLSKeyFile string
	// TLSServerName is the name checked against broker certificates
	// (default empty: the host of each broker address).
	TLSServerName string

	// Loaded by Validate.
	loaded    bool
	tlsConfig *tls.Config
	mechanism sasl.Mechanism
}

// RegisterFlags registers -kafka-brokers, -kafka-client-id, the -kafka-tls*
// flags and the -kafka-sasl-* flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet, defaultClientID string) {
	fs.Var(&c.Brokers, "kafka-brokers", "comma-separated Kafka seed brokers, host:port (required)")
	fs.StringVar(&c.ClientID, "kafka-client-id", defaultClientID, "Kafka client id")
	fs.BoolVar(&c.TLS, "kafka-tls", false, "connect to the brokers with TLS")
	fs.StringVar(&c.TLSCAFile, "kafka-tls-ca-file", "", "PEM file of the CAs that sign the broker certificates (default: system roots; needs -kafka-tls)")
	fs.StringVar(&c.TLSCertFile, "kafka-tls-cert-file", "", "PEM client certificate for mutual TLS (needs -kafka-tls-key-file)")
	fs.StringVar(&c.TLSKeyFile, "kafka-tls-key-file", "", "PEM private key of -kafka-tls-cert-file")
	fs.StringVar(&c.TLSServerName, "kafka-tls-server-name", "", "name to check in broker certificates (default: each broker's host)")
	fs.StringVar(&c.SASLMechanism, "kafka-sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default: none)")
	fs.StringVar(&c.SASLUser, "kafka-sasl-user", "", "SASL user name")
	fs.StringVar(&c.SASLPasswordFile, "kafka-sasl-password-file", "", "file holding the SASL password (else $"+EnvSASLPassword+")")
}

// Validate names the bad setting. It also reads the CA, certificate, key and
// password files, so that Opts cannot fail later; call it before Opts.
func (c *Config) Validate() error {
	if len(c.Brokers) == 0 {
		return fmt.Errorf("%s is required", cli.Named("kafka-brokers"))
	}
	for _, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return fmt.Errorf("%s: %q is not host:port", cli.Named("kafka-brokers"), b)
		}
	}
	return c.load()
}

// load reads the TLS and SASL settings and their files.
func (c *Config) load() error {
	tc, err := c.loadTLS()
	if err != nil {
		return err
	}
	mech, err := c.loadSASL()
	if err != nil {
		return err
	}
	c.tlsConfig, c.mechanism, c.loaded = tc, mech, true
	return nil
}

func (c *Config) loadTLS() (*tls.Config, error) {
	if !c.TLS {
		for _, kv := range [][2]string{
			{"kafka-tls-ca-file", c.TLSCAFile},
			{"kafka-tls-cert-file", c.TLSCertFile},
			{"kafka-tls-key-file", c.TLSKeyFile},
			{"kafka-tls-server-name", c.TLSServerName},
		} {
			if kv[1] != "" {
				return nil, fmt.Errorf("%s is set but %s is off", cli.Named(kv[0]), cli.Named("kafka-tls"))
			}
		}
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
	if c.TLSCAFile != "" {
		pem, err := os.ReadFile(c.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", cli.Named("kafka-tls-ca-file"), err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: %s holds no PEM certificate", cli.Named("kafka-tls-ca-file"), c.TLSCAFile)
		}
		tc.RootCAs = pool
	}
	switch {
	case c.TLSCertFile != "" && c.TLSKeyFile == "":
		return nil, fmt.Errorf("%s is required with -kafka-tls-cert-file", cli.Named("kafka-tls-key-file"))
	case c.TLSCertFile == "" && c.TLSKeyFile != "":
		return nil, fmt.Errorf("%s is required with -kafka-tls-key-file", cli.Named("kafka-tls-cert-file"))
	case c.TLSCertFile != "":
		pair, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			// The tls package never quotes key material in its errors.
			return nil, fmt.Errorf("%s / -kafka-tls-key-file: %v", cli.Named("kafka-tls-cert-file"), err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// canonicalMechanism returns the mechanism's canonical spelling, or "" when
// it is unknown.
func canonicalMechanism(m string) string {
	switch u := strings.ToUpper(strings.TrimSpace(m)); u {
	case MechanismPlain, MechanismSCRAMSHA256, MechanismSCRAMSHA512:
		return u
	}
	return ""
}

func (c *Config) loadSASL() (sasl.Mechanism, error) {
	if c.SASLMechanism == "" {
		if c.SASLUser != "" {
			return nil, fmt.Errorf("%s is required with -kafka-sasl-user", cli.Named("kafka-sasl-mechanism"))
		}
		if c.SASLPasswordFile != "" {
			return nil, fmt.Errorf("%s is required with -kafka-sasl-password-file", cli.Named("kafka-sasl-mechanism"))
		}
		return nil, nil
	}
	mech := canonicalMechanism(c.SASLMechanism)
	if mech == "" {
		return nil, fmt.Errorf("%s: %q is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512", cli.Named("kafka-sasl-mechanism"), c.SASLMechanism)
	}
	if mech == MechanismPlain && !c.TLS {
		return nil, fmt.Errorf("%s: PLAIN sends the password in clear text: turn on %s", cli.Named("kafka-sasl-mechanism"), cli.Named("kafka-tls"))
	}
	if c.SASLUser == "" {
		return nil, fmt.Errorf("%s is required with -kafka-sasl-mechanism", cli.Named("kafka-sasl-user"))
	}
	pw, err := c.password()
	if err != nil {
		return nil, err
	}
	switch mech {
	case MechanismPlain:
		return plain.Auth{User: c.SASLUser, Pass: pw}.AsMechanism(), nil
	case MechanismSCRAMSHA256:
		return scram.Auth{User: c.SASLUser, Pass: pw}.AsSha256Mechanism(), nil
	default:
		return scram.Auth{User: c.SASLUser, Pass: pw}.AsSha512Mechanism(), nil
	}
}

// password finds the SASL password: the SASLPassword field, else the file,
// else the environment. Exactly one source may be set.
func (c *Config) password() (string, error) {
	env, envSet := os.LookupEnv(EnvSASLPassword)
	envSet = envSet && env != ""
	sources := 0
	for _, set := range []bool{c.SASLPassword != "", c.SASLPasswordFile != "", envSet} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		return "", fmt.Errorf("the SASL password is set more than once (%s, $%s, Config.SASLPassword): keep one", cli.Named("kafka-sasl-password-file"), EnvSASLPassword)
	}
	switch {
	case c.SASLPassword != "":
		return c.SASLPassword, nil
	case envSet:
		return env, nil
	case c.SASLPasswordFile != "":
		b, err := os.ReadFile(c.SASLPasswordFile)
		if err != nil {
			// *PathError names the file and the reason, not the content.
			return "", fmt.Errorf("%s: %v", cli.Named("kafka-sasl-password-file"), err)
		}
		pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if pw == "" {
			return "", fmt.Errorf("%s: %s is empty", cli.Named("kafka-sasl-password-file"), c.SASLPasswordFile)
		}
		return pw, nil
	}
	return "", fmt.Errorf("%s or $%s is required with -kafka-sasl-mechanism", cli.Named("kafka-sasl-password-file"), EnvSASLPassword)
}

// Opts returns the client options for these settings, logging through log.
//
// Call Validate first. If the settings were never validated, Opts loads the
// TLS and SASL settings now; when that fails, the returned options make every
// connection attempt fail with the reason, so a client never falls back to an
// unencrypted or unauthenticated connection.
func (c *Config) Opts(log *slog.Logger) []kgo.Opt {
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...)}
	if c.ClientID != "" {
		opts = append(opts, kgo.ClientID(c.ClientID))
	}
	if log != nil {
		opts = append(opts, kgo.WithLogger(quietLogger{kslog.New(log.With(slog.String("component", "kafka")))}))
	}
	if !c.loaded {
		if err := c.load(); err != nil {
			err = fmt.Errorf("kafka settings: %w", err)
			return append(opts, kgo.Dialer(func(context.Context, string, string) (net.Conn, error) { return nil, err }))
		}
	}
	if c.tlsConfig != nil {
		// franz-go clones the config per broker and fills in ServerName
		// from the broker's host when it is empty.
		opts = append(opts, kgo.DialTLSConfig(c.tlsConfig.Clone()))
	}
	if c.mechanism != nil {
		opts = append(opts, kgo.SASL(c.mechanism))
	}
	return opts
}

// String describes the settings with the password redacted.
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "brokers=%s client_id=%s tls=%t", strings.Join(c.Brokers, ","), c.ClientID, c.TLS)
	for _, kv := range [][2]string{
		{"tls_ca_file", c.TLSCAFile}, {"tls_cert_file", c.TLSCertFile}, {"tls_key_file", c.TLSKeyFile},
		{"tls_server_name", c.TLSServerName}, {"sasl_mechanism", c.SASLMechanism}, {"sasl_user", c.SASLUser},
		{"sasl_password_file", c.SASLPasswordFile},
	} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s=%s", kv[0], kv[1])
		}
	}
	if c.SASLPassword != "" {
		b.WriteString(" sasl_password=" + redacted)
	}
	return b.String()
}

// GoString keeps %#v from printing the password.
func (c Config) GoString() string { return "kafkaconn.Config{" + c.String() + "}" }

// LogValue logs the settings with the password redacted.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("brokers", strings.Join(c.Brokers, ",")),
		slog.String("client_id", c.ClientID),
		slog.Bool("tls", c.TLS),
	}
	if c.TLS {
		attrs = append(attrs,
			slog.String("tls_ca_file", c.TLSCAFile),
			slog.String("tls_cert_file", c.TLSCertFile),
			slog.String("tls_key_file", c.TLSKeyFile),
			slog.String("tls_server_name", c.TLSServerName))
	}
	if c.SASLMechanism != "" {
		attrs = append(attrs,
			slog.String("sasl_mechanism", c.SASLMechanism),
			slog.String("sasl_user", c.SASLUser),
			slog.String("sasl_password_file", c.SASLPasswordFile))
	}
	if c.SASLPassword != "" {
		attrs = append(attrs, slog.String("sasl_password", redacted))
	}
	return slog.GroupValue(attrs...)
}
