package admin

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate for 127.0.0.1 and its key
// into dir and returns the certificate's pool and the two paths.
func writeCert(t *testing.T, dir, cn string) (*x509.CertPool, string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(c)
	return pool, cert, keyFile
}

// TestAdminServesTLS: with -admin-tls-cert-file/-admin-tls-key-file the
// admin API answers over TLS only (a plain HTTP request is refused), and a
// rotated certificate is served without a restart; the flags go together.
func TestAdminServesTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pool, cert, key := writeCert(t, dir, "first")
	var f Flags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	f.RegisterFlags(fs, "127.0.0.1:0")
	if err := fs.Parse([]string{"-admin", "-admin-token-file", "t", "-admin-tls-cert-file", cert}); err != nil {
		t.Fatal(err)
	}
	if err := f.Validate(); err == nil || !strings.Contains(err.Error(), "admin-tls-key-file") {
		t.Fatalf("a certificate without its key: %v", err)
	}
	f.TLSKeyFile = key
	if err := f.Validate(); err != nil {
		t.Fatal(err)
	}
	h, _ := testHandler(t)
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, f, h, slog.New(slog.NewJSONHandler(&logs, nil))) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; {
		for _, l := range strings.Split(logs.String(), "\n") {
			var m struct{ Msg, Addr string }
			if json.Unmarshal([]byte(l), &m) == nil && m.Msg == "admin listening" && strings.Contains(l, `"tls":true`) {
				addr = m.Addr
			}
		}
		if addr == "" && time.Now().After(deadline) {
			t.Fatalf("no admin listening line with tls: %s", logs.String())
		}
		time.Sleep(10 * time.Millisecond) // polling the log
	}
	get := func(pool *x509.CertPool) (string, error) {
		cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		resp, err := cl.Get("https://" + addr + "/api/v1/session")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		return resp.Status + " " + resp.TLS.PeerCertificates[0].Subject.CommonName, nil
	}
	if got, err := get(pool); err != nil || got != "401 Unauthorized first" {
		t.Fatalf("over TLS: %q %v", got, err)
	}
	resp, err := http.Get("http://" + addr + "/api/v1/session")
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP answered %s: %s", resp.Status, b)
		}
	}
	// Rotation: new files, newer times.
	pool2, _, _ := writeCert(t, dir, "second")
	later := time.Now().Add(2 * time.Second)
	_ = os.Chtimes(cert, later, later)
	_ = os.Chtimes(key, later, later)
	if got, err := get(pool2); err != nil || got != "401 Unauthorized second" {
		t.Fatalf("after rotation: %q %v", got, err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
