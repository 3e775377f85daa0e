// Package pgconn builds the binaries' PostgreSQL pools.
//
// TLS: put it in the URL. `sslmode=verify-full&sslrootcert=/path/ca.pem`
// makes pgx check both the server's certificate chain against that CA and its
// name against the URL's host; `sslcert=`/`sslkey=` add a client
// certificate. See docs/security.md.
//
// Secrets: a password in -database-url is visible in `ps`; set the URL through
// ONCEFLOW_DATABASE_URL, or keep the password out of it with
// -database-password-file (or libpq's PGPASSWORD / PGPASSFILE, which pgx
// honours). Config's String and LogValue redact the password.
package pgconn

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/internal/cli"
)

// Config holds the database settings shared by both binaries.
type Config struct {
	// URL is a libpq connection string or URL (required).
	URL string
	// MaxConns bounds the pool (default 10).
	MaxConns int
	// PasswordFile is a file whose content (one trailing newline trimmed)
	// is the password, overriding any in URL (default empty).
	PasswordFile string
}

// RegisterFlags registers -database-url, -database-max-conns and
// -database-password-file.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "database-url", "", "PostgreSQL connection URL (required); for TLS add sslmode=verify-full&sslrootcert=/path/ca.pem")
	fs.IntVar(&c.MaxConns, "database-max-conns", 10, "maximum connections in the pool")
	fs.StringVar(&c.PasswordFile, "database-password-file", "", "file holding the database password (overrides one in the URL)")
}

// Validate names the bad setting.
func (c *Config) Validate() error {
	if c.URL == "" {
		return fmt.Errorf("%s is required", cli.Named("database-url"))
	}
	if _, err := pgxpool.ParseConfig(c.URL); err != nil {
		return fmt.Errorf("%s: %v", cli.Named("database-url"), err)
	}
	if c.MaxConns < 1 {
		return fmt.Errorf("%s must be at least 1, got %d", cli.Named("database-max-conns"), c.MaxConns)
	}
	if _, err := c.password(); err != nil {
		return err
	}
	return nil
}

func (c *Config) password() (string, error) {
	if c.PasswordFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(c.PasswordFile)
	if err != nil {
		// *PathError names the file and the reason, never the content.
		return "", fmt.Errorf("%s: %v", cli.Named("database-password-file"), err)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if pw == "" {
		return "", fmt.Errorf("%s: %s is empty", cli.Named("database-password-file"), c.PasswordFile)
	}
	return pw, nil
}

// Pool opens a pool named appName (shown in pg_stat_activity).
func (c *Config) Pool(ctx context.Context, appName string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %v", err)
	}
	pc.MaxConns = int32(c.MaxConns)
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = appName
	}
	if err := c.applyPassword(pc.ConnConfig); err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, pc)
}

// Conn opens a single connection (for migrations).
func (c *Config) Conn(ctx context.Context, appName string) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(c.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %v", err)
	}
	cc.RuntimeParams["application_name"] = appName
	if err := c.applyPassword(cc); err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cc)
}

func (c *Config) applyPassword(cc *pgx.ConnConfig) error {
	pw, err := c.password()
	if err != nil || pw == "" {
		return err
	}
	cc.Password = pw
	return nil
}

// (pgx's parse errors already redact the password.)

// keywordPassword matches password=... in a keyword/value connection string:
// quoted, or unquoted up to unescaped white space (as libpq and pgx read it).
var keywordPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.?)+)`)

// RedactURL hides the password of a connection URL or keyword/value string.
// URLs are split the way libpq (and pgx) split them, not by net/url, which
// rejects some URLs that pgx accepts: the user information ends at the first
// '@' before any '/', and query parameters named password are masked.
func RedactURL(s string) string {
	scheme := ""
	for _, p := range []string{"postgresql://", "postgres://"} {
		if strings.HasPrefix(s, p) {
			scheme = p
			break
		}
	}
	if scheme == "" {
		return keywordPassword.ReplaceAllString(s, "${1}xxxxx")
	}
	rest := s[len(scheme):]
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		if user, _, hasPassword := strings.Cut(rest[:i], ":"); hasPassword {
			rest = user + ":xxxxx" + rest[i:]
		}
	}
	if q := strings.IndexByte(rest, '?'); q >= 0 {
		params := strings.Split(rest[q+1:], "&")
		for j, kv := range params {
			k, _, _ := strings.Cut(kv, "=")
			if dk, err := url.PathUnescape(k); err != nil || strings.EqualFold(strings.TrimSpace(dk), "password") {
				params[j] = k + "=xxxxx"
			}
		}
		rest = rest[:q+1] + strings.Join(params, "&")
	}
	return scheme + rest
}

// String describes the settings with the password redacted.
func (c Config) String() string {
	s := fmt.Sprintf("url=%s max_conns=%d", RedactURL(c.URL), c.MaxConns)
	if c.PasswordFile != "" {
		s += " password_file=" + c.PasswordFile
	}
	return s
}

// GoString keeps %#v from printing the password.
func (c Config) GoString() string { return "pgconn.Config{" + c.String() + "}" }

// LogValue logs the settings with the password redacted.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("url", RedactURL(c.URL)),
		slog.Int("max_conns", c.MaxConns),
		slog.String("password_file", c.PasswordFile))
}
