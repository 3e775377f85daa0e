package testkit

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/onceflow/onceflow/internal/kafkanode"
)

// TestCA is a certificate authority generated for one test run: ECDSA P-256,
// valid for a day, never written anywhere but the test's directories.
type TestCA struct {
	// CertPEM is the CA certificate, PEM encoded.
	CertPEM []byte
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
}

// NewTestCA generates a CA named cn.
func NewTestCA(cn string) (*TestCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"onceflow tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &TestCA{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key}, nil
}

// Issue signs a leaf certificate for cn, usable by servers and clients.
// hosts are DNS names or IP addresses put in the subject alternative names.
// The key is an unencrypted PKCS#8 PEM block.
func (ca *TestCA) Issue(cn string, hosts ...string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"onceflow tests"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tpl.IPAddresses = append(tpl.IPAddresses, ip)
		} else {
			tpl.DNSNames = append(tpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	pk, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n.Add(n, big.NewInt(1))
}

// KafkaUser is a SASL user of a SecureKafka broker. The user exists for
// SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN.
type KafkaUser struct {
	Name     string
	Password string
	// Super makes the user a Kafka super user (no ACLs needed).
	Super bool
}

// SecureKafkaOptions configures StartSecureKafka.
type SecureKafkaOptions struct {
	// Users are created at format time. Names and passwords are limited to
	// letters, digits, '.', '_' and '-'. At least one user should be Super.
	Users []KafkaUser
	// ACLs turns on Kafka's StandardAuthorizer: users that are not Super
	// need ACLs (allow.everyone.if.no.acl.found=false).
	ACLs bool
}

// SecureKafka is a private single-node Kafka (KRaft) with one SASL_SSL
// listener, started from the jars that scripts/services.sh resolves. The
// controller and inter-broker listeners are PLAINTEXT on loopback and are not
// advertised to clients.
type SecureKafka struct {
	// Brokers is the SASL_SSL listener, 127.0.0.1:port.
	Brokers string
	// CA signed the broker certificate (SANs 127.0.0.1 and localhost).
	CA *TestCA
	// CAFile is CA.CertPEM on disk.
	CAFile string
	// Dir holds the configuration, data and server.log.
	Dir   string
	Users []KafkaUser

	node *kafkanode.Node
	done chan struct{}
}

var safeName = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// StartSecureKafka formats and starts the broker and returns once a SCRAM
// client of the first Super user answers a metadata request over TLS. Stop
// kills it and removes its files. Meant for TestMain (one broker per test
// binary).
func StartSecureKafka(ctx context.Context, o SecureKafkaOptions) (_ *SecureKafka, err error) {
	var admin *KafkaUser
	for i, u := range o.Users {
		if !safeName.MatchString(u.Name) || !safeName.MatchString(u.Password) {
			return nil, fmt.Errorf("secure kafka: user %d: name and password must match %s", i, safeName)
		}
		if u.Super && admin == nil {
			admin = &o.Users[i]
		}
	}
	if admin == nil {
		return nil, errors.New("secure kafka: no Super user to check readiness with")
	}
	dir, err := os.MkdirTemp("", "onceflow-securekafka-")
	if err != nil {
		return nil, err
	}
	k := &SecureKafka{Dir: dir, Users: o.Users, done: make(chan struct{})}
	defer func() {
		if err != nil {
			k.Stop()
		}
	}()
	if k.CA, err = NewTestCA("onceflow test kafka CA"); err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := k.CA.Issue("127.0.0.1", "127.0.0.1", "localhost")
	if err != nil {
		return nil, err
	}
	k.CAFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(k.CAFile, k.CA.CertPEM, 0o644); err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	port, iport, cport := ports[0], ports[1], ports[2]
	k.Brokers = fmt.Sprintf("127.0.0.1:%d", port)

	var plainUsers, supers strings.Builder
	supers.WriteString("User:ANONYMOUS")
	for _, u := range o.Users {
		fmt.Fprintf(&plainUsers, ` user_%s="%s"`, u.Name, u.Password)
		if u.Super {
			supers.WriteString(";User:" + u.Name)
		}
	}
	listeners := fmt.Sprintf(`listeners=SASL_SSL://127.0.0.1:%[1]d,INTERNAL://127.0.0.1:%[2]d,CONTROLLER://127.0.0.1:%[3]d
advertised.listeners=SASL_SSL://127.0.0.1:%[1]d,INTERNAL://127.0.0.1:%[2]d
inter.broker.listener.name=INTERNAL
listener.security.protocol.map=SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required%[4]s;
ssl.keystore.type=PEM
ssl.keystore.certificate.chain=%[5]s
ssl.keystore.key=%[6]s
ssl.client.auth=none
`, port, iport, cport, plainUsers.String(), propertyValue(certPEM), propertyValue(keyPEM))
	if o.ACLs {
		listeners += "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n" +
			"allow.everyone.if.no.acl.found=false\n" +
			"super.users=" + supers.String() + "\n"
	}
	var scramUsers []string
	for _, u := range o.Users {
		for _, m := range []string{"SCRAM-SHA-256", "SCRAM-SHA-512"} {
			scramUsers = append(scramUsers, "--add-scram", fmt.Sprintf("%s=[name=%s,password=%s]", m, u.Name, u.Password))
		}
	}
	node, err := prepareKafkaNode(ctx, dir, listeners, cport, "512m", scramUsers...)
	if err != nil {
		return nil, fmt.Errorf("secure kafka: %w", err)
	}
	if err = node.Start(); err != nil {
		return nil, fmt.Errorf("secure kafka: %w", err)
	}
	k.node = node
	go func() { <-node.Done(); close(k.done) }()

	if err := k.waitReady(ctx, *admin); err != nil {
		return nil, err
	}
	return k, nil
}

// waitReady polls with a SCRAM client until the broker answers, the process
// exits or ctx ends.
func (k *SecureKafka) waitReady(ctx context.Context, u KafkaUser) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(k.CA.CertPEM)
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(k.Brokers),
		kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
		kgo.SASL(scram.Auth{User: u.Name, Pass: u.Password}.AsSha256Mechanism()),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = cl.Ping(pctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-k.done:
			return fmt.Errorf("secure kafka exited during start: see %s", k.LogHint())
		case <-ctx.Done():
			return fmt.Errorf("secure kafka did not answer on %s (%v): see %s", k.Brokers, last, k.LogHint())
		case <-tick.C:
		}
	}
}

// LogHint names the broker's log files and quotes the end of server.log.
func (k *SecureKafka) LogHint() string {
	b, _ := os.ReadFile(filepath.Join(k.Dir, "server.log"))
	o, _ := os.ReadFile(filepath.Join(k.Dir, "stdout.log"))
	return fmt.Sprintf("%s/server.log:\n%s\nstdout.log:\n%s", k.Dir, lastLinesOf(string(b), 10), lastLinesOf(string(o), 10))
}

// Stop kills the broker and removes its files. Safe to call more than once.
func (k *SecureKafka) Stop() {
	if k.node != nil {
		k.node.Kill()
	}
	if k.Dir != "" {
		_ = os.RemoveAll(k.Dir)
	}
}

// kafkaClasspath asks scripts/services.sh for the cached Kafka jars.
func kafkaClasspath(ctx context.Context) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return kafkanode.Classpath(ctx, filepath.Join(root, "scripts", "services.sh"))
}

// propertyValue writes a multi-line PEM as one .properties value.
func propertyValue(pemBytes []byte) string {
	return strings.ReplaceAll(strings.TrimSpace(string(pemBytes)), "\n", `\n`)
}

func freePorts(n int) ([]int, error) { return kafkanode.FreePorts(n) }

func lastLinesOf(s string, n int) string { return kafkanode.LastLines(s, n) }
