package security

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/pgconn"
	"github.com/onceflow/onceflow/internal/pgtemp"
	"github.com/onceflow/onceflow/internal/testkit"
)

// TestPostgresVerifyFull: a private PostgreSQL with ssl=on and a certificate
// from a test CA. Through pgconn (Pool and Conn), sslmode=verify-full with
// sslrootcert of that CA connects over TLS; another CA, or a host name the
// certificate does not carry, is refused.
func TestPostgresVerifyFull(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ca, err := testkit.NewTestCA("onceflow test PostgreSQL CA")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue("127.0.0.1", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := pgtemp.StartWithOptions(ctx, pgtemp.Options{
		SSLCertFile: writeFile(t, "server.crt", certPEM),
		SSLKeyFile:  writeFile(t, "server.key", keyPEM),
	})
	if err != nil {
		t.Fatalf("PostgreSQL with TLS: %v", err)
	}
	t.Cleanup(func() {
		if err := cluster.Stop(); err != nil {
			t.Logf("stop PostgreSQL: %v", err)
		}
	})
	other, err := testkit.NewTestCA("some other CA")
	if err != nil {
		t.Fatal(err)
	}
	rightCA := writeFile(t, "ca.pem", ca.CertPEM)
	wrongCA := writeFile(t, "other-ca.pem", other.CertPEM)
	dsn := func(host, mode, rootCert string) string {
		q := url.Values{"sslmode": {mode}}
		if rootCert != "" {
			q.Set("sslrootcert", rootCert)
		}
		u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: host + ":" + itoa(cluster.Port), Path: "/postgres", RawQuery: q.Encode()}
		return u.String()
	}

	cases := []struct {
		name    string
		url     string
		wantErr string
	}{
		{"verify-full right CA", dsn("127.0.0.1", "verify-full", rightCA), ""},
		{"verify-full wrong CA", dsn("127.0.0.1", "verify-full", wrongCA), "certificate signed by unknown authority"},
		{"verify-full wrong host", dsn("localhost", "verify-full", rightCA), "wanted to match localhost"},
		{"verify-full system roots", dsn("127.0.0.1", "verify-full", ""), "certificate signed by unknown authority"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := pgconn.Config{URL: tc.url, MaxConns: 2}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("validate: %v", err)
			}
			pool, err := cfg.Pool(ctx, "onceflow-security-test")
			if err != nil {
				t.Fatalf("pool: %v", err)
			}
			defer pool.Close()
			var ssl bool
			var version string
			err = pool.QueryRow(ctx, `SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&ssl, &version)
			conn, cerr := cfg.Conn(ctx, "onceflow-security-test")
			if cerr == nil {
				defer conn.Close(ctx)
			}
			if tc.wantErr == "" {
				if err != nil || cerr != nil {
					t.Fatalf("connect: pool %v, conn %v", err, cerr)
				}
				if !ssl {
					t.Fatal("connected without TLS")
				}
				t.Logf("connected with %s", version)
				return
			}
			for _, e := range []error{err, cerr} {
				if e == nil || !strings.Contains(e.Error(), tc.wantErr) {
					t.Fatalf("connect = %v, want an error containing %q", e, tc.wantErr)
				}
			}
			t.Logf("error: %v", err)
		})
	}
}

func itoa(n int) string {
	const digits = "0123456789"
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{digits[n%10]}, b...)
	}
	return string(b)
}
