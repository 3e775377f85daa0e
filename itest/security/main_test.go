// Package security tests onceflow's connection security against real
// servers: a private Kafka broker with a SASL_SSL listener, SCRAM/PLAIN users
// and ACLs (one per test binary, started in TestMain), a private PostgreSQL
// with TLS, and the least-privilege database roles of deploy/sql/roles.sql.
package security

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/onceflow/onceflow/internal/testkit"
)

// Kafka users of the private broker. Only admin is a super user; relay and
// consumer get exactly the ACLs docs/security.md lists, on resources named
// with prefix.
const (
	adminUser    = "admin"
	adminPass    = "admin-Adm1n-pw-7c1e"
	relayUser    = "relay"
	relayPass    = "relay-R3lay-pw-94be"
	consumerUser = "consumer"
	consumerPass = "consumer-C0ns-pw-5d0a"

	// prefix starts every topic, transactional id and group the tests use.
	prefix = "sec-"
)

var broker *testkit.SecureKafka

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	start := time.Now()
	var err error
	broker, err = testkit.StartSecureKafka(ctx, testkit.SecureKafkaOptions{
		ACLs: true,
		Users: []testkit.KafkaUser{
			{Name: adminUser, Password: adminPass, Super: true},
			{Name: relayUser, Password: relayPass},
			{Name: consumerUser, Password: consumerPass},
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "itest/security:", err)
		return 1
	}
	defer broker.Stop()
	if err := grantACLs(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "itest/security: grant ACLs:", err)
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "itest/security: SASL_SSL broker on %s ready in %s\n", broker.Brokers, time.Since(start).Round(time.Millisecond))
	}
	return m.Run()
}

// grantACLs gives the relay and consumer users what docs/security.md says
// they need, and nothing else.
func grantACLs(ctx context.Context) error {
	cl, err := adminClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	relay, consumer := "User:"+relayUser, "User:"+consumerUser
	builders := []*kadm.ACLBuilder{
		// relay: write the event topics and the checkpoint topic, read the
		// checkpoint topic back, transactional ids of its prefix.
		kadm.NewACLs().Allow(relay).Topics(prefix).ResourcePatternType(kadm.ACLPatternPrefixed).
			Operations(kadm.OpWrite, kadm.OpDescribe),
		kadm.NewACLs().Allow(relay).Topics(prefix + "checkpoints").ResourcePatternType(kadm.ACLPatternPrefixed).
			Operations(kadm.OpRead),
		kadm.NewACLs().Allow(relay).TransactionalIDs(prefix).ResourcePatternType(kadm.ACLPatternPrefixed).
			Operations(kadm.OpWrite, kadm.OpDescribe),
		// consumer: read the event topics, its group, write the DLQ.
		kadm.NewACLs().Allow(consumer).Topics(prefix).ResourcePatternType(kadm.ACLPatternPrefixed).
			Operations(kadm.OpRead, kadm.OpDescribe),
		kadm.NewACLs().Allow(consumer).Groups(prefix).ResourcePatternType(kadm.ACLPatternPrefixed).
			Operations(kadm.OpRead, kadm.OpDescribe),
		kadm.NewACLs().Allow(consumer).Topics(prefix+"dlq").ResourcePatternType(kadm.ACLPatternPrefixed).
			Operations(kadm.OpWrite, kadm.OpDescribe),
	}
	for _, b := range builders {
		b.AllowHosts("*")
		res, err := adm.CreateACLs(ctx, b)
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Err != nil {
				return fmt.Errorf("%s %s %s: %w", r.Principal, r.Name, r.Operation, r.Err)
			}
		}
	}
	return nil
}

// adminClient is a super-user client of the private broker.
func adminClient(opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(broker.Brokers),
		kgo.DialTLSConfig(tlsConfig(broker.CA.CertPEM)),
		kgo.SASL(scram.Auth{User: adminUser, Pass: adminPass}.AsSha512Mechanism()),
	}, opts...)...)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
