package admin

import (
	"flag"
	"fmt"
	"net"

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
}

// RegisterFlags registers -admin, -admin-addr (default defaultAddr) and
// -admin-token-file.
func (f *Flags) RegisterFlags(fs *flag.FlagSet, defaultAddr string) {
	fs.BoolVar(&f.Enabled, "admin", false, "serve the admin API (and, in the consumer, the console page) on -admin-addr; needs -admin-token-file")
	fs.StringVar(&f.Addr, "admin-addr", defaultAddr, "address of the admin API when -admin is on (loopback by default; see docs/console.md)")
	fs.StringVar(&f.TokenFile, "admin-token-file", "", "file of bearer tokens for the admin API, one per line: TOKEN or NAME TOKEN (required with -admin)")
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
	return nil
}
