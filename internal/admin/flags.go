package admin

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/onceflow/onceflow/internal/cli"
)

// Flags are a binary's admin server settings.
type Flags struct {
	// Enabled turns the admin server on (-admin; default off).
	Enabled bool
	// Addr is where it listens (-admin-addr); a loopback address by
	// default, so that only the machine (or pod) itself can reach it.
	Addr string
	// TokenFile holds the bearer tokens (-admin-token-file; required with
	// -admin).
	TokenFile string
	// TLSCertFile and TLSKeyFile, both or neither, serve the admin API
	// (and the console) over TLS (-admin-tls-cert-file,
	// -admin-tls-key-file; default: plain HTTP). The files are read again
	// when they change, so a rotated certificate needs no restart.
	TLSCertFile string
	TLSKeyFile  string
}

// RegisterFlags registers -admin, -admin-addr (default defaultAddr),
// -admin-token-file and -admin-tls-cert-file/-admin-tls-key-file.
func (f *Flags) RegisterFlags(fs *flag.FlagSet, defaultAddr string) {
	fs.BoolVar(&f.Enabled, "admin", false, "serve the admin API (and, in the consumer, the console page) on -admin-addr; needs -admin-token-file")
	fs.StringVar(&f.Addr, "admin-addr", defaultAddr, "address of the admin API when -admin is on (loopback by default; see docs/console.md)")
	fs.StringVar(&f.TokenFile, "admin-token-file", "", "file of bearer tokens for the admin API, one per line: TOKEN or NAME TOKEN (required with -admin)")
	fs.StringVar(&f.TLSCertFile, "admin-tls-cert-file", "", "PEM certificate (chain) to serve the admin API over TLS (needs -admin-tls-key-file; default: plain HTTP)")
	fs.StringVar(&f.TLSKeyFile, "admin-tls-key-file", "", "PEM private key of -admin-tls-cert-file")
}

// Validate names the bad setting.
func (f *Flags) Validate() error {
	if !f.Enabled {
		return nil
	}
	if f.TokenFile == "" {
		return fmt.Errorf("%s is required with -admin: the admin API never runs without authentication", cli.Named("admin-token-file"))
	}
	if _, _, err := net.SplitHostPort(f.Addr); err != nil {
		return fmt.Errorf("%s %q: %v", cli.Named("admin-addr"), f.Addr, err)
	}
	if (f.TLSCertFile == "") != (f.TLSKeyFile == "") {
		return fmt.Errorf("%s and %s go together: give both or neither", cli.Named("admin-tls-cert-file"), cli.Named("admin-tls-key-file"))
	}
	if f.TLSCertFile != "" {
		if _, err := tls.LoadX509KeyPair(f.TLSCertFile, f.TLSKeyFile); err != nil {
			return fmt.Errorf("%s / %s: %v", cli.Named("admin-tls-cert-file"), cli.Named("admin-tls-key-file"), err)
		}
	}
	return nil
}

// certReloader serves the key pair of certFile and keyFile, read again when
// either file's modification time changes (a rotated Secret); a pair that
// fails to load keeps the previous one in service.
type certReloader struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	certMod time.Time
	keyMod  time.Time
}

func (c *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cs, cerr := os.Stat(c.certFile)
	ks, kerr := os.Stat(c.keyFile)
	if cerr == nil && kerr == nil && c.cert != nil && cs.ModTime().Equal(c.certMod) && ks.ModTime().Equal(c.keyMod) {
		return c.cert, nil
	}
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		if c.cert != nil {
			return c.cert, nil
		}
		return nil, fmt.Errorf("admin TLS key pair: %w", err)
	}
	c.cert = &pair
	if cerr == nil && kerr == nil {
		c.certMod, c.keyMod = cs.ModTime(), ks.ModTime()
	}
	return c.cert, nil
}

// tlsConfig is the admin server's TLS configuration (TLS 1.2 or newer),
// nil without -admin-tls-cert-file.
func (f *Flags) tlsConfig() *tls.Config {
	if f.TLSCertFile == "" {
		return nil
	}
	r := &certReloader{certFile: f.TLSCertFile, keyFile: f.TLSKeyFile}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.get}
}
