package kafkaconn_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/cli"
	"github.com/onceflow/onceflow/internal/kafkaconn"
)

// TestClientCertificatePresented: with -kafka-tls-cert-file/-key-file the
// client presents its certificate to a server that requires one, and checks
// the server's name against -kafka-tls-server-name.
func TestClientCertificatePresented(t *testing.T) {
	t.Parallel()
	b := setup(t)
	caPEM, err := os.ReadFile(b.caFile)
	if err != nil {
		t.Fatal(err)
	}
	// The bundle's CA signed client.pem for "localhost"; reuse it as the
	// server certificate too (it carries both usages).
	serverCert, err := tls.LoadX509KeyPair(b.certFile, b.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		tc := conn.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			peer <- "handshake: " + err.Error()
			return
		}
		certs := tc.ConnectionState().PeerCertificates
		if len(certs) == 0 {
			peer <- "no client certificate"
			return
		}
		peer <- certs[0].Subject.CommonName
	}()

	c := kafkaconn.Config{
		Brokers:       cli.List{ln.Addr().String()},
		TLS:           true,
		TLSCAFile:     b.caFile,
		TLSCertFile:   b.certFile,
		TLSKeyFile:    b.keyFile,
		TLSServerName: "localhost",
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(c.Opts(nil), kgo.RequestRetries(0))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = cl.Ping(ctx) // the fake server speaks no Kafka; only the handshake matters
	select {
	case got := <-peer:
		if got != "client" {
			t.Fatalf("server saw %q, want the client certificate (CN client)", got)
		}
	case <-ctx.Done():
		t.Fatal("no TLS connection reached the server")
	}
}
